package cluster

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

func TestBinaryVersion(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := controlplane.Assets(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "kwok")
	silent := filepath.Join(dir, "silent")
	if err := os.WriteFile(silent, []byte("#!/bin/sh\nexit 0\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		bin     string
		want    *regexp.Regexp
		wantErr string
	}{
		"kube-controller-manager": {bin: filepath.Join(assets, "kube-controller-manager"), want: regexp.MustCompile(`^Kubernetes v1\.\d+\.\d+$`)},
		"kube-scheduler":          {bin: filepath.Join(assets, "kube-scheduler"), want: regexp.MustCompile(`^Kubernetes v1\.\d+\.\d+$`)},
		"kwok":                    {bin: filepath.Join(assets, "kwok"), want: regexp.MustCompile(`^kwok version v0\.8\.0 `)},
		"silent":                  {bin: silent, wantErr: silent + " --version printed nothing"},
		"missing":                 {bin: missing, wantErr: missing + " --version: fork/exec " + missing + ": no such file or directory"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := BinaryVersion(context.Background(), tc.bin)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.want.MatchString(got) {
				t.Fatalf("version %q (%v), want a match of %s", got, err, tc.want)
			}
		})
	}
}
