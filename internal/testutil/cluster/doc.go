// Package cluster puts the rest of a control plane around the test API
// server that package controlplane starts: the real kube-controller-manager
// (the controllers of DefaultControllers: Deployment, ReplicaSet,
// EndpointSlice, ServiceAccount, node lifecycle, garbage collector,
// namespace, disruption) and kube-scheduler, and
// kwok, which runs fake Nodes and plays the pods bound to them through the
// Stage objects of stages/ (started, Ready a cold start later, removed a
// delay after their deletion begins, failed on demand by a chaos label
// and restarted once, staying Ready, by another). Pods get IPs from a 127.0.0.0/8 CIDR; a Network listens on each of
// those addresses while its pod serves and relays what it accepts to one
// real process, so traffic sent to a pod IP reaches, say, one simserver,
// and a dial to a pod that does not serve is refused. The Network plays
// what the kubelet would do to the server: it stops accepting when the
// pod's deletion begins, or a preStop sleep later (PreStopSleep); it
// counts, per address, the connections and the bytes clients sent. The API server
// refuses loopback addresses in EndpointSlices, so Services over these
// pods keep empty EndpointSlices.
//
// Every process it starts leads a process group of its own and binds
// 127.0.0.1 only (kwok binds nothing); Stop ends the groups with SIGTERM,
// then SIGKILL. Nothing here imports package testing, so the demo can use
// it as well as the suites.
//
// Concurrency model: a Cluster is started and stopped by one goroutine; its
// other methods may be called from any goroutine while it runs. A Network
// serves each address from a goroutine of its own and guards its state
// (which addresses serve, their connections and counts) with one mutex;
// FollowPods drives that state from a Pod informer.
package cluster
