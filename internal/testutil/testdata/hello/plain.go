//go:build !testutilflavour

package main

const flavour = "plain"
