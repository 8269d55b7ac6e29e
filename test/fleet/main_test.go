package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tiergate/tiergate/internal/testutil"
)

// Binaries built by TestMain.
var tiergateBin, simserverBin string

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
	root, err := testutil.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tiergateBin = filepath.Join(dir, "tiergate")
	simserverBin = filepath.Join(dir, "simserver")
	for out, pkg := range map[string]string{tiergateBin: ".", simserverBin: "./hack/simserver"} {
		if err := testutil.BuildBinary(root, out, pkg, testutil.BuildOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}
