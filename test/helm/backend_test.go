package helm

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// defaultBackendArgs are the backend transport flags of the default values.
var defaultBackendArgs = []string{
	"--backend-dial-timeout=5s", "--backend-idle-timeout=90s", "--backend-max-idle-conns-per-host=1024",
	"--backend-response-header-timeout=300s", "--backend-max-response-header-bytes=1048576",
}

// The backend transport values become flags, and a CA from a Secret or a
// ConfigMap is mounted read-only where --backend-ca-file points.
func TestBackendFlags(t *testing.T) {
	caMount := map[string]any{"name": "backend-ca", "mountPath": "/var/run/tiergate/backend-ca", "readOnly": true}
	items := []any{map[string]any{"key": "ca.pem", "path": "ca.crt"}}
	tests := map[string]struct {
		set, setJSON []string
		// wantArgs follow --state; wantVolumes and wantMounts follow the
		// push token's.
		wantArgs                []string
		wantVolumes, wantMounts []any
	}{
		"defaults": {wantArgs: defaultBackendArgs},
		"every transport setting": {
			set:     []string{"dispatcher.backend.idleTimeoutSeconds=30", "dispatcher.backend.maxIdleConnsPerHost=64", "dispatcher.backend.responseHeaderTimeoutSeconds=900", "dispatcher.backend.maxResponseHeaderBytes=2097152"},
			setJSON: []string{"dispatcher.backend.dialTimeoutSeconds=0.5"},
			wantArgs: []string{"--backend-dial-timeout=0.5s", "--backend-idle-timeout=30s", "--backend-max-idle-conns-per-host=64",
				"--backend-response-header-timeout=900s", "--backend-max-response-header-bytes=2097152"},
		},
		"server name": {
			set:      []string{"dispatcher.backend.tls.serverName=vllm.llm.svc"},
			wantArgs: append(append([]string{}, defaultBackendArgs...), "--backend-server-name=vllm.llm.svc"),
		},
		"CA from a Secret": {
			set:         []string{"dispatcher.backend.tls.caSecret.name=llm-ca", "dispatcher.backend.tls.caSecret.key=ca.pem"},
			wantArgs:    append(append([]string{}, defaultBackendArgs...), "--backend-ca-file=/var/run/tiergate/backend-ca/ca.crt"),
			wantVolumes: []any{map[string]any{"name": "backend-ca", "secret": map[string]any{"secretName": "llm-ca", "defaultMode": 0o444, "items": items}}},
			wantMounts:  []any{caMount},
		},
		"CA from a ConfigMap": {
			set:         []string{"dispatcher.backend.tls.caConfigMap.name=llm-ca", "dispatcher.backend.tls.caConfigMap.key=ca.pem"},
			wantArgs:    append(append([]string{}, defaultBackendArgs...), "--backend-ca-file=/var/run/tiergate/backend-ca/ca.crt"),
			wantVolumes: []any{map[string]any{"name": "backend-ca", "configMap": map[string]any{"name": "llm-ca", "defaultMode": 0o444, "items": items}}},
			wantMounts:  []any{caMount},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var flags []string
			if len(tc.set) > 0 {
				flags = append(flags, "--set", strings.Join(tc.set, ","))
			}
			for _, j := range tc.setJSON {
				flags = append(flags, "--set-json", j)
			}
			d := find(t, render(t, flags...), "Deployment", "tiergate-dispatcher")
			c := container(t, d)
			var args []string
			for _, a := range c["args"].([]any) {
				args = append(args, a.(string))
			}
			want := append([]string{
				"dispatcher", "--listen=:8080", "--admin-listen=:9090",
				"--admin-token-file=/var/run/tiergate/push-token/token", "--drain-timeout=30s", "--state=local",
			}, tc.wantArgs...)
			want = append(want, "--memory-limit=$(TIERGATE_MEMORY_LIMIT)")
			if diff := cmp.Diff(want, args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			vols := field[[]any](t, d, "spec", "template", "spec", "volumes")
			if diff := cmp.Diff(toYAMLValue(t, append([]any{}, tc.wantVolumes...)), vols[1:]); diff != "" {
				t.Errorf("volumes after the token's (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(toYAMLValue(t, append([]any{tokenMount}, tc.wantMounts...)), c["volumeMounts"]); diff != "" {
				t.Errorf("volumeMounts (-want +got):\n%s", diff)
			}
		})
	}
}
