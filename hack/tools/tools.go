// Package tools pins the control-plane and tool dependencies of the
// tiergate test environment. It is a module of its own so none of this
// reaches the product's go.mod.
package tools
