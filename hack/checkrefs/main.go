package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
)

// patterns are the files checked: Markdown, Go comments, and the #
// comments of scripts, YAML and build files. (A template of a generated
// doc, like simulate/testdata/scheduling.md.tmpl, links relative to where
// its output goes; the output is checked.)
var patterns = []string{"*.md", "*.go", "*.sh", "*.yaml", "*.yml", "Makefile", "Dockerfile"}

func main() {
	root := "."
	if len(os.Args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: checkrefs [REPO_ROOT]")
		os.Exit(2)
	}
	if len(os.Args) == 2 {
		root = os.Args[1]
	}
	os.Exit(run(root, os.Stdout, os.Stderr))
}

// run checks the tracked files of the repository at root, reports to
// stdout and stderr, and returns the exit status.
func run(root string, stdout, stderr io.Writer) int {
	cmd := exec.Command("git", append([]string{"ls-files", "-z", "--"}, patterns...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		fmt.Fprintf(stderr, "checkrefs: git ls-files: %v\n", err)
		return 2
	}
	fsys := os.DirFS(root)
	var files []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		// A tracked file deleted in the work tree says nothing (a
		// reference to it is judged like any other).
		if _, err := fs.Stat(fsys, f); f != "" && err == nil {
			files = append(files, f)
		}
	}
	missing, n, err := Check(fsys, files)
	if err != nil {
		fmt.Fprintf(stderr, "checkrefs: %v\n", err)
		return 2
	}
	for _, m := range missing {
		fmt.Fprintln(stderr, m)
	}
	if len(missing) > 0 {
		return 1
	}
	fmt.Fprintf(stdout, "checkrefs: %d references in %d files resolve\n", n, len(files))
	return 0
}
