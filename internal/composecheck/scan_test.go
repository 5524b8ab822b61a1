package composecheck

import (
	"bufio"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// composeService is what the checks need from one compose service.
type composeService struct {
	Name string
	// Props maps each of the service's keys (image, build, entrypoint,
	// environment, ...) to its text: the inline value and the lines nested
	// under it, trimmed and joined by newlines.
	Props map[string]string
	// Env lists the variable names set under environment:, in file order,
	// with the line each is on.
	Env []envVar
}

type envVar struct {
	Name string
	Line int
}

// envKey matches one entry of an environment block, in map form
// (KEY: value) or list form (- KEY=value), quoted or not.
var envKey = regexp.MustCompile(`^(?:-\s*)?["']?([A-Za-z_][A-Za-z0-9_]*)\s*["']?\s*(?:[:=]|$)`)

// scanCompose reads the services of a compose file with a line scanner
// instead of a YAML parser: it understands block-style mappings and lists
// nested by indentation, which is all docker-compose.yml uses. Flow-style
// environment blocks ({A: b}) are reported as errors rather than skipped.
// Lines nested under a key, block scalars included, belong to that key.
func scanCompose(r io.Reader) ([]composeService, error) {
	var (
		out          []composeService
		cur          *composeService
		inServices   bool
		svcIndent    = -1 // indent of service names under services:
		propIndent   = -1 // indent of the current service's keys
		prop         string
		propChildren []string
		lineNo       int
	)
	flush := func() {
		if cur != nil && prop != "" {
			cur.Props[prop] = strings.TrimSpace(cur.Props[prop] + "\n" + strings.Join(propChildren, "\n"))
		}
		prop, propChildren = "", nil
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		lineNo++
		raw := strings.TrimRight(sc.Text(), " \t\r")
		text := strings.TrimLeft(raw, " ")
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if strings.HasPrefix(text, "\t") {
			return nil, fmt.Errorf("line %d: indented with a tab", lineNo)
		}
		indent := len(raw) - len(text)
		key, value, isKey := splitKey(text)

		if indent == 0 {
			flush()
			cur = nil
			inServices = isKey && key == "services"
			svcIndent, propIndent = -1, -1
			continue
		}
		if !inServices {
			continue
		}
		if svcIndent < 0 {
			svcIndent = indent
		}
		switch {
		case indent < svcIndent:
			return nil, fmt.Errorf("line %d: indented less than the service names", lineNo)
		case indent == svcIndent:
			if !isKey || value != "" {
				return nil, fmt.Errorf("line %d: expected a service name, got %q", lineNo, text)
			}
			flush()
			out = append(out, composeService{Name: key, Props: map[string]string{}})
			cur = &out[len(out)-1]
			propIndent = -1
			continue
		}
		if propIndent < 0 {
			propIndent = indent
		}
		switch {
		case indent < propIndent:
			return nil, fmt.Errorf("line %d: indented less than the keys of service %s", lineNo, cur.Name)
		case indent == propIndent:
			if !isKey {
				return nil, fmt.Errorf("line %d: expected a key of service %s, got %q", lineNo, cur.Name, text)
			}
			flush()
			prop = key
			cur.Props[prop] = value
			if key == "environment" && value != "" {
				return nil, fmt.Errorf("line %d: service %s: write environment as a block, one variable a line", lineNo, cur.Name)
			}
		default:
			propChildren = append(propChildren, text)
			if prop == "environment" {
				m := envKey.FindStringSubmatch(text)
				if m == nil {
					return nil, fmt.Errorf("line %d: service %s: cannot read an environment entry from %q", lineNo, cur.Name, text)
				}
				cur.Env = append(cur.Env, envVar{Name: m[1], Line: lineNo})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	flush()
	return out, nil
}

// splitKey splits "key: value" and "key:" lines. List items and scalars are
// not keys.
func splitKey(text string) (key, value string, ok bool) {
	if strings.HasPrefix(text, "- ") || text == "-" {
		return "", "", false
	}
	i := strings.Index(text, ":")
	if i <= 0 || (i+1 < len(text) && text[i+1] != ' ') {
		return "", "", false
	}
	key = strings.Trim(text[:i], `"'`)
	if strings.ContainsAny(key, " \t") {
		return "", "", false
	}
	value = strings.TrimSpace(text[i+1:])
	if j := strings.Index(value, " #"); j >= 0 && !strings.ContainsAny(value[:j], `"'`) {
		value = strings.TrimSpace(value[:j])
	}
	return key, value, true
}

func TestScanCompose(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    map[string][]string // service -> env names
		props   map[string]string   // "service.key" -> text
		wantErr string
	}{
		{
			name: "map and list forms",
			yaml: `
name: x
services:
  a:
    image: a:1
    environment:
      ORDO_ONE: "1"
      "ORDO_TWO": two # comment
      PLAIN: x
  b:
    entrypoint: ["/usr/local/bin/b"]
    environment:
      - ORDO_THREE=3
      - "ORDO_FOUR=4"
      - ORDO_FIVE
volumes:
  data:
`,
			want: map[string][]string{
				"a": {"ORDO_ONE", "ORDO_TWO", "PLAIN"},
				"b": {"ORDO_THREE", "ORDO_FOUR", "ORDO_FIVE"},
			},
			props: map[string]string{
				"a.image":      "a:1",
				"b.entrypoint": `["/usr/local/bin/b"]`,
			},
		},
		{
			name: "block scalar and nested keys stay with their key",
			yaml: `
services:
    init:
        entrypoint:
          - sh
          - -c
          - |
            environment:
              ORDO_NOT_AN_ENV: 1
        depends_on:
          db:
            condition: service_healthy
        environment:
          ORDO_REAL: 1
`,
			want: map[string][]string{"init": {"ORDO_REAL"}},
			props: map[string]string{
				"init.entrypoint": "- sh\n- -c\n- |\nenvironment:\nORDO_NOT_AN_ENV: 1",
			},
		},
		{
			name:    "flow-style environment is refused",
			yaml:    "services:\n  a:\n    environment: {ORDO_X: 1}\n",
			wantErr: "write environment as a block",
		},
		{
			name:    "unreadable environment entry",
			yaml:    "services:\n  a:\n    environment:\n      ? complex\n",
			wantErr: "cannot read an environment entry",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svcs, err := scanCompose(strings.NewReader(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("scanCompose error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for _, s := range svcs {
				var names []string
				for _, e := range s.Env {
					names = append(names, e.Name)
				}
				got[s.Name] = names
				for k, v := range s.Props {
					if want, ok := tt.props[s.Name+"."+k]; ok && v != want {
						t.Errorf("%s.%s = %q, want %q", s.Name, k, v, want)
					}
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("environment = %v, want %v", got, tt.want)
			}
		})
	}
}
