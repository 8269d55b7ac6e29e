//go:build !linux

package main

import "syscall"

// childAttr puts a child in its own process group (so a terminal's Ctrl-C
// reaches only the demo, which then stops the children in order).
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// readCmdline needs /proc; elsewhere the demo cannot tell.
func readCmdline(int) string { return "" }

// pidsMentioning needs /proc; elsewhere the demo relies on process groups.
func pidsMentioning(string) []int { return nil }

// groupMembers needs /proc.
func groupMembers(int) []int { return nil }
