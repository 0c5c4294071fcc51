//go:build ignore

// The scoreboard's Go app for Fiber's idempotency middleware
// (github.com/gofiber/fiber/v2/middleware/idempotency): the conformance
// kit's counting endpoint (conformance/kit.go) behind it, wired as its
// documentation shows. scripts/scoreboard builds it in a module of its own
// in a temporary directory (build tag ignore keeps it out of this
// repository's module; Fiber is never a dependency of idem).
//
// Two settings differ from the defaults, and the table says so: KeyHeader
// is Idempotency-Key (the default is X-Idempotency-Key), and
// KeyHeaderValidate accepts any key (the default wants 36 characters, a
// UUID; the kit's keys are not). SB_EXPIRY_SECONDS sets Lifetime.
//
// It prints one line on stdout, `SB_LISTENING http://127.0.0.1:PORT <module>@<version>`.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
)

func main() {
	var count atomic.Int64
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	cfg := idempotency.Config{
		KeyHeader:         "Idempotency-Key",
		KeyHeaderValidate: func(string) error { return nil },
	}
	if s, err := strconv.Atoi(os.Getenv("SB_EXPIRY_SECONDS")); err == nil && s > 0 {
		cfg.Lifetime = time.Duration(s) * time.Second
	}
	app.Use(idempotency.New(cfg))
	orders := func(c *fiber.Ctx) error {
		if ms, err := strconv.Atoi(c.Query("delay_ms")); err == nil && ms > 0 {
			time.Sleep(time.Duration(min(ms, 60000)) * time.Millisecond)
		}
		n := count.Add(1)
		status, err := strconv.Atoi(c.Query("status"))
		if err != nil || status < 200 || status > 599 {
			status = fiber.StatusCreated
		}
		var echo any
		if json.Unmarshal(c.Body(), &echo) != nil {
			echo = nil
		}
		out, _ := json.Marshal(map[string]any{"order": n, "echo": echo})
		c.Set("Content-Type", "application/json")
		c.Set("Location", "/orders/"+strconv.FormatInt(n, 10))
		c.Set("ETag", `"order-`+strconv.FormatInt(n, 10)+`"`)
		return c.Status(status).Send(out)
	}
	app.Post("/orders", orders)
	app.Post("/orders/:id", orders)
	app.Get("/count", func(c *fiber.Ctx) error { return c.JSON(map[string]int64{"count": count.Load()}) })

	addr := os.Getenv("SB_ADDR")
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	version := "github.com/gofiber/fiber/v2@unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/gofiber/fiber/v2" {
				version = d.Path + "@" + d.Version
			}
		}
	}
	fmt.Printf("SB_LISTENING http://%s %s\n", ln.Addr(), version)
	if err := app.Listener(ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
