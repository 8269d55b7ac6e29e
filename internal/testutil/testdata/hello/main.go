// Command hello is what the tests of package testutil build.
package main

import "fmt"

func main() { fmt.Println("hello " + flavour) }
