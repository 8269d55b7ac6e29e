package testutil

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// built are the real tiergate and simserver binaries, built on first use
// into a directory TestMain removes.
var built struct {
	once sync.Once
	dir  string
	bins Binaries
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		if err := os.RemoveAll(built.dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// binaries builds Binaries once per test run.
func binaries(t *testing.T) Binaries {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "testutil-bin-"); built.err == nil {
			built.bins, built.err = BuildBinaries(built.dir, BuildOptions{})
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bins
}
