// Command escapekey prints the path of each key given: the key escaped as
// one path segment, so that "/" and "%" in a key stay part of it.
// Usage: go run ./escapekey KEY...
package main

import (
	"fmt"
	"net/url"
	"os"
)

func main() {
	for _, key := range os.Args[1:] {
		fmt.Println("/v1/keys/" + url.PathEscape(key))
	}
}
