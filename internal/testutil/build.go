package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// RaceEnv names the variable that asks the suites to build the binaries
// under test with the race detector.
const RaceEnv = "TIERGATE_TEST_RACE"

// RaceRequested reports whether RaceEnv is set (to anything).
func RaceRequested() bool { return os.Getenv(RaceEnv) != "" }

// ModuleRoot is the nearest directory at or above the working directory
// that holds a go.mod: for a test, the root of its module.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testutil: no go.mod at or above the working directory")
		}
		dir = parent
	}
}

// BuildOptions change how BuildBinary builds.
type BuildOptions struct {
	// Race builds with -race.
	Race bool
	// Env is added to the environment of `go build` (e.g. GOWORK=off).
	Env []string
}

// BuildBinary runs `go build -o out pkg` in dir (the module root; pkg is
// relative to it, like "./hack/simserver", or an import path). The error
// carries the compiler's output.
func BuildBinary(dir, out, pkg string, o BuildOptions) error {
	args := []string{"build", "-o", out}
	if o.Race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = dir
	if len(o.Env) > 0 {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
