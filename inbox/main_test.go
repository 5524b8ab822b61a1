package inbox_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/ordo-relay/ordo/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(wrap{m})
}

// wrap removes the binaries testkit built once the tests have run.
type wrap struct{ m *testing.M }

func (w wrap) Run() int {
	code := w.m.Run()
	testkit.RemoveBinaries()
	return code
}

var _ = os.Getenv
