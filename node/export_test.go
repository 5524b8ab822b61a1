package node

// Hooks are the test hooks of a node (hooks.go).
type Hooks = testHooks

// WithHooks returns o with the test hooks h.
func WithHooks(o Options, h Hooks) Options {
	o.hooks = h
	return o
}
