package controlplane

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Assets is the directory of the control-plane binaries: the
// KUBEBUILDER_ASSETS variable, or root/bin/k8s. The error says to run
// `make tools` when kube-apiserver, etcd or kubectl is missing there or
// not executable.
func Assets(root string) (string, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin", "k8s")
	}
	for _, name := range []string{"kube-apiserver", "etcd", "kubectl"} {
		p := filepath.Join(assets, name)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("control-plane binary %s is missing or not executable (KUBEBUILDER_ASSETS=%q); run `make tools` first", p, os.Getenv("KUBEBUILDER_ASSETS"))
		}
	}
	return assets, nil
}

// Option adjusts the environment before Start starts it.
type Option func(*envtest.Environment)

// WithAPIServerFlag sets a kube-apiserver flag, such as
// --audit-log-path, on top of envtest's.
func WithAPIServerFlag(name, value string) Option {
	return func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Configure().Set(name, value)
	}
}

// WithoutAPIServerFlag leaves out a kube-apiserver flag that envtest
// would set, such as --disable-admission-plugins (envtest turns the
// ServiceAccount plugin off because it runs no controller manager).
func WithoutAPIServerFlag(name string) Option {
	return func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Configure().Disable(name)
	}
}

// Start starts kube-apiserver and etcd from assets, with the CRDs of
// root/config/crd/bases installed, serving the types of scheme. The caller
// stops the returned environment.
func Start(root, assets string, scheme *runtime.Scheme, opts ...Option) (*envtest.Environment, *rest.Config, error) {
	env := &envtest.Environment{
		Scheme:                scheme,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
	}
	for _, o := range opts {
		o(env)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err)
	}
	return env, cfg, nil
}

// WriteKubeconfig writes a kubeconfig for env's API server to path (mode
// 0600): the admin's when user is nil, else that of user, whom it adds.
func WriteKubeconfig(env *envtest.Environment, user *envtest.User, path string) error {
	kc := env.KubeConfig
	if user != nil {
		u, err := env.AddUser(*user, nil)
		if err != nil {
			return err
		}
		if kc, err = u.KubeConfig(); err != nil {
			return err
		}
	}
	return os.WriteFile(path, kc, 0o600)
}
