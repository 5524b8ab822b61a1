package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"golang.org/x/sync/errgroup"
)

// component is one long-running part of a node: a blocking Run that
// returns when its context ends, named for its errors.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// errStoppedEarly is the error of a component that returned nil before its
// stage was stopped: a node that silently lost a part would look alive.
var errStoppedEarly = errors.New("stopped before it was told to")

// stage is a set of components started together and stopped together. It
// owns their goroutines: stop cancels their context (their own, not the
// node's, so that stages stop one at a time, in order) and waits for every
// one of them.
type stage struct {
	name   string
	cancel context.CancelFunc
	g      errgroup.Group
	after  func() // called once the stage has stopped; may be nil
}

// stages are a node's running stages, in the order they started.
type stages struct {
	list   []*stage
	fail   context.CancelCauseFunc
	logger *slog.Logger
}

// start runs comps as a new stage. A component that returns while its
// stage runs, with an error or without, makes the node stop (fail).
func (ss *stages) start(name string, comps ...component) *stage {
	ctx, cancel := context.WithCancel(context.Background())
	s := &stage{name: name, cancel: cancel}
	for _, c := range comps {
		s.g.Go(func() error {
			err := c.run(ctx)
			if ctx.Err() == nil {
				if err == nil {
					err = errStoppedEarly
				}
				err = fmt.Errorf("%s: %w", c.name, err)
				ss.fail(err)
				return err
			}
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	ss.list = append(ss.list, s)
	return s
}

// stop stops every stage, the last started first, and returns the errors
// of every component (errors.Join).
func (ss *stages) stop() error {
	var errs []error
	for i := len(ss.list) - 1; i >= 0; i-- {
		s := ss.list[i]
		s.cancel()
		errs = append(errs, s.g.Wait())
		ss.logger.Debug("stage stopped", "stage", s.name)
		if s.after != nil {
			s.after()
		}
	}
	ss.list = nil
	return errors.Join(errs...)
}
