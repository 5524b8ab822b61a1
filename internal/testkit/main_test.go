package testkit

import (
	"testing"

	"go.uber.org/goleak"
)

// removeBinaries runs the tests, then deletes the binaries BuildBinary made,
// before goleak looks for leaked goroutines.
type removeBinaries struct{ m *testing.M }

func (r removeBinaries) Run() int {
	defer RemoveBinaries()
	return r.m.Run()
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(removeBinaries{m})
}
