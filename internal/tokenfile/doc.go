// Package tokenfile follows a bearer token kept in a file, as Kubernetes
// mounts a Secret: the kubelet replaces the whole payload by swapping the
// "..data" symlink, so the file's path stays and the file behind it
// changes. A Follower stats the path (through the symlinks) on an injected
// clock and re-reads it when the file behind it changed; a new token takes
// over at once, and the token it replaced is still accepted for a grace of
// at most MaxGrace, so the two ends of a rotation, which see the new file
// at different moments, converge without a refusal.
//
// Keyring is the pure part: the current token, the one it replaced and
// until when, compared in constant time. The dispatcher runs Run, which
// polls every second, and checks presented tokens with Verify; the
// controller's push client calls Poll before each push (one stat) and sends
// Tokens.
//
// Concurrency model: a Follower is safe for concurrent use. Run is at most
// one polling goroutine; polls are serialised among themselves, and Verify
// and Tokens take the token mutex only briefly (a poll reads the file
// outside it). A Keyring is a value without locking.
package tokenfile
