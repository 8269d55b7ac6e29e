package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeName is the name of the i-th fake Node.
func NodeName(i int) string { return fmt.Sprintf("kwok-node-%d", i) }

// createNodes creates the fake Nodes (kwok's annotation and no taint of
// their own, so any pod may land on them) and waits until each is Ready
// (kwok) and schedulable (the node-lifecycle controller took the API
// server's not-ready taint off).
func (c *Cluster) createNodes(ctx context.Context) error {
	for i := range c.opts.Nodes {
		name := NodeName(i)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{NodeAnnotation: "fake"},
			Labels: map[string]string{
				"kubernetes.io/hostname": name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
				"type":                   "kwok",
			},
		}}
		if err := c.createNode(ctx, n); err != nil {
			return fmt.Errorf("creating Node %s: %w", name, err)
		}
		c.Nodes = append(c.Nodes, name)
	}
	return c.waitNodesReady(ctx, 60*time.Second)
}

// createNode creates n. A Node of its name that an earlier Cluster on this
// API server left (a package's suites share the API server) is deleted
// first: its status and lease are the stopped kwok's, and kwok did not
// play the pods bound to such a Node.
func (c *Cluster) createNode(ctx context.Context, n *corev1.Node) error {
	err := c.client.Create(ctx, n)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	old := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	if err := c.client.Delete(ctx, old); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting the Node an earlier cluster left: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.client.Get(ctx, client.ObjectKeyFromObject(old), old)
		if apierrors.IsNotFound(err) {
			return c.client.Create(ctx, n)
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("the Node an earlier cluster left is still there 10s after its deletion")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitNodesReady waits until every Node is Ready and has no taint.
func (c *Cluster) waitNodesReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		notReady, err := c.notReadyNodes(ctx)
		if err != nil {
			return err
		}
		if len(notReady) == 0 {
			return nil
		}
		switch {
		case c.Kwok.Exited():
			return fmt.Errorf("kwok exited (%v) before Nodes %v were Ready:\n%s", c.Kwok.Err(), notReady, c.Kwok.Tail(30))
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("nodes %v not Ready and untainted within %s:\n%s", notReady, timeout, c.Logs(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) notReadyNodes(ctx context.Context) ([]string, error) {
	var out []string
	for _, name := range c.Nodes {
		var n corev1.Node
		if err := c.client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return nil, err
		}
		if !nodeIsReady(&n) || len(n.Spec.Taints) != 0 {
			out = append(out, fmt.Sprintf("%s (taints %v)", name, n.Spec.Taints))
		}
	}
	return out, nil
}

func nodeIsReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
