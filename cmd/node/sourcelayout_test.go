package main

import (
	"testing"

	"github.com/ordo-relay/ordo/node"
)

// TestParseConfigSourceLayout: -source-layout NAME=LAYOUT sets the layout
// of the source it names, from the flag or ORDO_SOURCE_LAYOUT; an unknown
// layout, an unknown source, the one-source form and an item that is not
// a pair are refused, naming the flag or the field.
func TestParseConfigSourceLayout(t *testing.T) {
	two := []string{"-source", "default=postgres://h/a", "-source", "shop=postgres://h/b"}
	layouts := func(d, s string) []node.Source {
		return []node.Source{{Name: "default", PostgresURL: "postgres://h/a", Layout: d},
			{Name: "shop", PostgresURL: "postgres://h/b", Layout: s}}
	}
	const flag = "-source-layout (ORDO_SOURCE_LAYOUT): "
	for _, c := range []struct {
		name string
		args []string
		env  func(string) (string, bool)
		want []node.Source
		errs []string
	}{
		{"none", two, env(), layouts("", ""), nil},
		{"flag", append(two, "-source-layout", "shop=article"), env(), layouts("", "article"), nil},
		{"environment", two, env("ORDO_SOURCE_LAYOUT", "shop=article"), layouts("", "article"), nil},
		{"unknown layout", append(two, "-source-layout", "shop=rebus"), env(), nil, []string{`source "shop"`, "rebus"}},
		{"unknown source", append(two, "-source-layout", "orders=article"), env(), nil, []string{flag + `source "orders" is not one of`}},
		{"one-source form", []string{"-source-layout", "default=article"}, env(), nil, []string{flag + `source "default": there is no -source`, "-table-layout"}},
		{"not a pair", append(two, "-source-layout", "article"), env(), nil, []string{flag + "an item is not NAME=LAYOUT"}},
		{"table-layout with sources", append(two, "-table-layout", "article"), env(), nil, []string{"-table-layout", "one-source form"}},
	} {
		t.Run(c.name, func(t *testing.T) { checkSourcesParse(t, c.args, c.env, c.want, c.errs) })
	}
}
