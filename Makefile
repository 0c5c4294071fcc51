# idem — run `make help` for the targets.
SQLC := go run github.com/sqlc-dev/sqlc/cmd/sqlc@v1.31.1

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run
run: ## Build bin/idem and start it on embedded SQLite in development mode (tokens printed).
	@test -x bin/idem || echo "building bin/idem: the first build downloads and compiles the modules (about 2 minutes on 2 cores)"
	go build -o bin/idem ./cmd/server
	bin/idem serve

.PHONY: test
test: ## Run every test (race detector, real throwaway PostgreSQL via pg_virtualenv, SQLite, browser).
	scripts/test

.PHONY: fuzz
fuzz: ## Fuzz every go test -fuzz target with 20000 inputs from its seed corpus (scripts/fuzz 1m for longer).
	scripts/fuzz

.PHONY: generate
generate: ## Regenerate the sqlc query code from db/schema and db/queries.
	$(SQLC) generate

.PHONY: check-generated
check-generated: ## Fail when the committed sqlc code is not current.
	$(SQLC) diff

.PHONY: lint
lint: ## go vet (root module and the SDK module client/), gofmt, OpenAPI lint (redocly), Dockerfile lint.
	go vet ./...
	cd client && go vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	scripts/lint-openapi
	scripts/lint-dockerfile

# idem_build_info's version and revision; empty (no git, e.g. in the image
# build) falls back to the Go build info.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)

.PHONY: build
build: ## Build the static server binary into bin/idem (the Dockerfile's command).
	CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X github.com/idem-dev/idem/metrics.Version=$(VERSION) -X github.com/idem-dev/idem/metrics.Revision=$(REVISION)" -o bin/idem ./cmd/server
