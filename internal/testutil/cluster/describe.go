package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// What a report says of the components: which binary ran and its version.

// ComponentInfo names one running component.
type ComponentInfo struct {
	Name    string `json:"name"`
	Binary  string `json:"binary"`
	Version string `json:"version"`
	Pid     int    `json:"pid"`
}

// Binary is the path of the executable the component runs.
func (c *Component) Binary() string { return c.cmd.Path }

// Args are the component's command-line arguments, the binary's name first.
func (c *Component) Args() []string { return slices.Clone(c.cmd.Args) }

// Controllers are the kube-controller-manager controllers the cluster runs.
func (c *Cluster) Controllers() []string { return slices.Clone(c.opts.Controllers) }

// Describe is the name, binary, version and pid of every component
// started so far.
func (c *Cluster) Describe(ctx context.Context) ([]ComponentInfo, error) {
	var out []ComponentInfo
	for _, comp := range c.Components() {
		v, err := BinaryVersion(ctx, comp.Binary())
		if err != nil {
			return nil, err
		}
		out = append(out, ComponentInfo{Name: comp.Name, Binary: comp.Binary(), Version: v, Pid: comp.Pid()})
	}
	return out, nil
}

// BinaryVersion is the first line `bin --version` prints, such as
// "Kubernetes v1.37.2" or "kwok version v0.8.0 go1.26.10 (linux/amd64)".
func BinaryVersion(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if first == "" {
		return "", fmt.Errorf("%s --version printed nothing", bin)
	}
	return first, nil
}
