// Command kube-controller-manager is the upstream controller manager, so
// the cluster suites run the real Deployment, ReplicaSet and EndpointSlice
// controllers instead of playing them.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
