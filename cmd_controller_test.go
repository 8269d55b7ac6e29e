package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tiergate/tiergate/controllers"
)

func TestControllerFlags(t *testing.T) {
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStderr string
	}{
		"help":                {[]string{"--help"}, 0, "Usage: tiergate controller [flags]"},
		"unknown flag":        {[]string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		"positional argument": {[]string{"extra"}, 2, `tiergate controller: unexpected arguments ["extra"]`},
		"zero resync":         {[]string{"--resync-period=0s"}, 2, "tiergate controller: invalid controller options: resync period 0s must be positive\n"},
		"negative timeout":    {[]string{"--push-timeout=-1s"}, 2, "tiergate controller: invalid controller options: push timeout -1s must be positive\n"},
		"no push worker":      {[]string{"--push-workers=0"}, 2, "tiergate controller: invalid controller options: push workers 0 must be at least 1\n"},
		"zero JWKS refetch": {[]string{"--jwks-min-refetch-interval=0s"}, 2,
			"tiergate controller: invalid controller options: JWKS min refetch 0s and timeout 10s must be positive\n"},
		"empty token key":    {[]string{"--push-token-secret-key="}, 2, "tiergate controller: invalid controller options: push token Secret key must not be empty\n"},
		"zero qps":           {[]string{"--kube-api-qps=0"}, 2, "tiergate controller: --kube-api-qps (0) and --kube-api-burst (100) must be positive"},
		"bad duration":       {[]string{"--resync-period=soon"}, 2, `invalid value "soon" for flag -resync-period`},
		"missing kubeconfig": {[]string{"--kubeconfig=/nonexistent/kubeconfig"}, 1, "/nonexistent/kubeconfig: no such file or directory"},
		"prometheus without a scheme": {[]string{"--prometheus-address=prometheus:9090"}, 2,
			`tiergate controller: invalid controller options: Prometheus address "prometheus:9090" must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090`},
		"prometheus over ftp": {[]string{"--prometheus-address=ftp://prometheus:9090"}, 2,
			`tiergate controller: invalid controller options: Prometheus address "ftp://prometheus:9090" must be an http or https URL`},
		"prometheus with no host": {[]string{"--prometheus-address=http://:9090"}, 2,
			`tiergate controller: invalid controller options: Prometheus address "http://:9090" must be an http or https URL`},
		"a good prometheus address gets as far as the kubeconfig": {[]string{"--prometheus-address=https://prom.monitoring:9091", "--kubeconfig=/nonexistent/kubeconfig"}, 1,
			"/nonexistent/kubeconfig: no such file or directory"},
		"token Secret without a namespace": {[]string{"--push-token-secret=tok"}, 2, `tiergate controller: --push-token-secret "tok" must be NAMESPACE/NAME`},
		"token Secret without a name":      {[]string{"--push-token-secret=ns/"}, 2, `tiergate controller: --push-token-secret "ns/" must be NAMESPACE/NAME`},
		"token Secret with two slashes":    {[]string{"--push-token-secret=ns/a/b"}, 2, `tiergate controller: --push-token-secret "ns/a/b" must be NAMESPACE/NAME`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := dispatch(append([]string{"controller"}, tc.args...), &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tc.wantStderr)
			}
		})
	}
}

// Without flags the controllers get exactly their default configuration:
// the flags take their defaults from it and change nothing.
func TestControllerFlagsDefaultToTheConfig(t *testing.T) {
	var stderr bytes.Buffer
	f, code, done := parseControllerFlags(nil, &stderr)
	if done {
		t.Fatalf("parse ended with %d: %s", code, stderr.String())
	}
	if diff := cmp.Diff(controllers.DefaultConfig(), f.cfg); diff != "" {
		t.Errorf("configuration (-want +got):\n%s", diff)
	}
	if f.pprofAddr != "0" {
		t.Errorf("--pprof-bind-address defaults to %q, want \"0\" (off)", f.pprofAddr)
	}
	f, _, done = parseControllerFlags([]string{"--pprof-bind-address=127.0.0.1:6060", "--push-workers=3", "--push-timeout=2s", "--push-token-secret=ns/tok"}, &stderr)
	want := controllers.DefaultConfig()
	want.PushWorkers, want.PushTimeout, want.PushTokenSecret = 3, 2*time.Second, types.NamespacedName{Namespace: "ns", Name: "tok"}
	if diff := cmp.Diff(want, f.cfg); done || diff != "" {
		t.Errorf("configuration of flags (-want +got):\n%s", diff)
	}
	if f.pprofAddr != "127.0.0.1:6060" {
		t.Errorf("--pprof-bind-address=127.0.0.1:6060 gave %q", f.pprofAddr)
	}
}
