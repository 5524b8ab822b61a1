package node

import (
	"reflect"
	"slices"
	"testing"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// TestNestedConfigsCoverTheirComponents: every field of a component's
// config is either set by the user through the node's nested config (same
// name, same type, copied as it is), or derived by the node (listed in
// its derived table, so that Validate reports it at its source), or the
// logger, transport or tracer provider (from Options) the node passes
// itself: a field added to a component's config fails this test until
// the node decides which. The node's defaults are the components' own,
// except a field whose zero means a value derived by the node (zeroed).
func TestNestedConfigsCoverTheirComponents(t *testing.T) {
	d := DefaultConfig()
	for _, c := range []struct {
		name     string
		settable any // a pointer to the node's nested config
		build    func(Config) any
		defaults any
		derived  []confcheck.From
		own      []string // fields of the node's nested config the component has not
		zeroed   []string // fields whose node default is 0: derived unless set
	}{
		{"Relay", &d.Relay, func(c Config) any { return c.relayConfig(nil) }, relay.DefaultConfig(), relayDerived, nil, nil},
		{"AMQP", &d.AMQP, func(c Config) any { return c.amqpConfig(nil) }, rabbitmq.DefaultConfig(), amqpDerived, nil,
			[]string{"ReconnectMax"}},
		{"Gossip", &d.Gossip, func(c Config) any { return c.membershipConfig(nil, nil) }, membership.DefaultConfig(), gossipDerived,
			[]string{"Insecure"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			set := reflect.ValueOf(c.settable).Elem()
			defs := reflect.ValueOf(c.defaults)
			for i := range set.NumField() {
				f := set.Type().Field(i)
				if slices.Contains(c.own, f.Name) {
					continue
				}
				df := defs.FieldByName(f.Name)
				switch {
				case !df.IsValid() || df.Type() != f.Type:
					t.Errorf("%s.%s has no field of its name and type in the component's config", c.name, f.Name)
				case slices.Contains(c.zeroed, f.Name):
					if !set.Field(i).IsZero() {
						t.Errorf("%s.%s defaults to %v, want 0 (derived)", c.name, f.Name, set.Field(i))
					}
				case f.Name != "URL" && !reflect.DeepEqual(set.Field(i).Interface(), df.Interface()):
					t.Errorf("%s.%s defaults to %v, the component to %v", c.name, f.Name, set.Field(i), df)
				}
				set.Field(i).Set(distinct(t, f.Type, i))
			}
			built := reflect.ValueOf(c.build(d))
			for i := range built.NumField() {
				name := built.Type().Field(i).Name
				derived := slices.ContainsFunc(c.derived, func(f confcheck.From) bool { return f.Field == name })
				sf := set.FieldByName(name)
				switch {
				case name == "Logger" || name == "Transport" || name == "TracerProvider" || derived:
					if sf.IsValid() {
						t.Errorf("%s.%s can be set, but the node sets it itself", c.name, name)
					}
				case !sf.IsValid():
					t.Errorf("%s of the component's config is neither settable through %s nor derived", name, c.name)
				case !reflect.DeepEqual(built.Field(i).Interface(), sf.Interface()):
					t.Errorf("%s.%s is %v, the component gets %v", c.name, name, sf, built.Field(i))
				}
			}
		})
	}
}

// distinct returns a value of type typ that no default holds, different
// for each i.
func distinct(t *testing.T, typ reflect.Type, i int) reflect.Value {
	v := reflect.New(typ).Elem()
	switch typ.Kind() {
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(1000003 + i))
	case reflect.String:
		v.SetString("distinct-" + typ.String() + string(rune('a'+i)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		v = reflect.MakeSlice(typ, 1, 1)
		if typ.Elem().Kind() == reflect.String {
			v.Index(0).SetString("h:1")
		} else {
			v.Index(0).Set(reflect.ValueOf([]byte("0123456789abcdef")))
		}
	default:
		t.Fatalf("no distinct value for %s", typ)
	}
	return v
}
