package fleet

import (
	"fmt"
	"os"
	"testing"

	"github.com/tiergate/tiergate/internal/testutil"
)

// bins are the binaries under test, built by TestMain.
var bins testutil.Binaries

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tiergate-fleet-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if bins, err = testutil.BuildBinaries(dir, testutil.BuildOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
