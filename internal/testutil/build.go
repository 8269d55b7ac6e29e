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

// Binaries are the programs the process-level suites run.
type Binaries struct {
	// Tiergate is the module's main package: controller and dispatcher.
	Tiergate string
	// Simserver is hack/simserver, the model server stand-in.
	Simserver string
}

// BuildBinaries builds Binaries into dir, both at once, from the module
// root.
func BuildBinaries(dir string, o BuildOptions) (Binaries, error) {
	root, err := ModuleRoot()
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{Tiergate: filepath.Join(dir, "tiergate"), Simserver: filepath.Join(dir, "simserver")}
	errs := make(chan error, 2)
	go func() { errs <- BuildBinary(root, b.Tiergate, ".", o) }()
	go func() { errs <- BuildBinary(root, b.Simserver, "./hack/simserver", o) }()
	if err := errors.Join(<-errs, <-errs); err != nil {
		return Binaries{}, err
	}
	return b, nil
}
