package controlplane

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/internal/testutil"
)

func TestAssets(t *testing.T) {
	write := func(t *testing.T, dir string, mode os.FileMode, names ...string) {
		t.Helper()
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("all three executable", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, 0o755, "kube-apiserver", "etcd", "kubectl")
		t.Setenv("KUBEBUILDER_ASSETS", dir)
		got, err := Assets("/nowhere")
		if err != nil || got != dir {
			t.Errorf("K8sAssets = %q, %v; want %q", got, err, dir)
		}
	})
	t.Run("default is root/bin/k8s", func(t *testing.T) {
		root := t.TempDir()
		dir := filepath.Join(root, "bin", "k8s")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, dir, 0o755, "kube-apiserver", "etcd", "kubectl")
		t.Setenv("KUBEBUILDER_ASSETS", "")
		got, err := Assets(root)
		if err != nil || got != dir {
			t.Errorf("K8sAssets = %q, %v; want %q", got, err, dir)
		}
	})
	tests := map[string]struct {
		setUp   func(t *testing.T, dir string)
		missing string
	}{
		"etcd missing": {func(t *testing.T, dir string) { write(t, dir, 0o755, "kube-apiserver", "kubectl") }, "etcd"},
		"kubectl not executable": {func(t *testing.T, dir string) {
			write(t, dir, 0o755, "kube-apiserver", "etcd")
			write(t, dir, 0o644, "kubectl")
		}, "kubectl"},
		"kube-apiserver a directory": {func(t *testing.T, dir string) {
			write(t, dir, 0o755, "etcd", "kubectl")
			if err := os.Mkdir(filepath.Join(dir, "kube-apiserver"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "kube-apiserver"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setUp(t, dir)
			t.Setenv("KUBEBUILDER_ASSETS", dir)
			_, err := Assets("/nowhere")
			want := "control-plane binary " + filepath.Join(dir, tc.missing) + " is missing or not executable (KUBEBUILDER_ASSETS=\"" + dir + "\"); run `make tools` first"
			if err == nil || err.Error() != want {
				t.Errorf("error %v, want %q", err, want)
			}
		})
	}
}

// TestStart starts a real kube-apiserver and etcd from bin/k8s.
func TestStart(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := Assets(root)
	if err != nil {
		t.Fatal(err)
	}
	env, cfg, err := Start(root, assets, runtime.NewScheme())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	if len(env.CRDs) == 0 {
		t.Error("no CRDs installed from config/crd/bases")
	}
	for _, crd := range env.CRDs {
		if !strings.HasSuffix(crd.Name, ".tiergate.dev") {
			t.Errorf("installed CRD %s", crd.Name)
		}
	}
	dir := t.TempDir()
	tests := map[string]struct {
		user     *envtest.User
		wantUser string
	}{
		"admin": {nil, ""},
		"a user": {&envtest.User{Name: "system:serviceaccount:ns:someone", Groups: []string{"system:authenticated"}},
			"system:serviceaccount:ns:someone"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".kubeconfig")
			if err := WriteKubeconfig(env, tc.user, path); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("mode %v, want 0600", fi.Mode().Perm())
			}
			kc, err := clientcmd.LoadFromFile(path)
			if err != nil {
				t.Fatal(err)
			}
			rc, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSuffix(rc.Host, "/") != strings.TrimSuffix(cfg.Host, "/") {
				t.Errorf("server %s, want %s", rc.Host, cfg.Host)
			}
			// envtest users authenticate with a client certificate whose
			// common name is the user name; the admin's is envtest's own.
			block, _ := pem.Decode(rc.CertData)
			if block == nil {
				t.Fatal("the kubeconfig has no client certificate")
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantUser != "" && cert.Subject.CommonName != tc.wantUser {
				t.Errorf("user %q, want %q", cert.Subject.CommonName, tc.wantUser)
			}
			if tc.wantUser == "" && cert.Subject.CommonName == "system:serviceaccount:ns:someone" {
				t.Error("the admin kubeconfig is the added user's")
			}
		})
	}
}
