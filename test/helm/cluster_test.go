package helm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// startCluster runs the rest of a control plane around the shared API
// server until t ends: kube-controller-manager, kube-scheduler and kwok
// with one fake Node (internal/testutil/cluster), so Deployments become
// pods that kwok makes Ready a short cold start after they start, and the
// Deployment controller reports their status. The other tests of this
// package run on the bare API server, where Deployments never run.
func startCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	controlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	started := time.Now()
	kc, err := cluster.Start(ctx, cp.env, cp.admin, cluster.Options{
		Assets:   k8sAssets,
		StageCRD: filepath.Join(repoRoot, "bin", "kwok", "kwok.x-k8s.io_stages.yaml"),
		Dir:      t.TempDir(),
		Stages:   cluster.StageOptions{ColdStart: 100 * time.Millisecond, TerminationDelay: 300 * time.Millisecond, CrashDetection: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatalf("starting kube-controller-manager, kube-scheduler and kwok: %v", err)
	}
	t.Logf("kube-controller-manager, kube-scheduler, kwok and a Ready Node up in %s", time.Since(started).Round(time.Millisecond))
	t.Cleanup(func() {
		stopping := time.Now()
		defer func() { t.Logf("the cluster stopped in %s", time.Since(stopping).Round(time.Millisecond)) }()
		if err := kc.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
		if t.Failed() {
			t.Logf("cluster logs:\n%s", kc.Logs(30))
		}
	})
	return kc
}
