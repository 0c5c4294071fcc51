# syntax=docker/dockerfile:1
#
# idem server image: a static Go binary (the docs, dashboard and migrations
# are embedded in it) on a distroless base, running as a non-root user.
#
#   docker build -t idem .
#   docker run --rm -e IDEM_DATABASE_URL=postgres://… idem migrate      # once: creates the ledger
#   docker run -p 8080:8080 -e IDEM_DATABASE_URL=postgres://… -e IDEM_JWT_JWKS_FILE=/etc/idem/jwks.json idem
#
# serve never creates a ledger outside development mode (no key, sqlite:):
# run `migrate` once, or set IDEM_CREATE_DB=1 for a throwaway container.
#
# CI has no Docker engine: it lints this file and runs the same `make build`
# the build stage runs, so the recipe cannot rot.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
# The Go SDK is its own module, which go.mod replaces with ./client.
COPY client/go.mod client/go.sum ./client/
RUN go mod download
COPY . .
# idem_build_info{version,revision}: .git stays out of the build context, so
# pass them: docker build --build-arg VERSION=$(git describe --tags --always)
# --build-arg REVISION=$(git rev-parse HEAD) .
ARG VERSION=""
ARG REVISION=""
# make build = CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X …Version -X …Revision" -o bin/idem ./cmd/server
RUN make build VERSION="$VERSION" REVISION="$REVISION" && mkdir -p /data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/bin/idem /usr/local/bin/idem
# The embedded SQLite store (only for trying the image out) writes here.
COPY --from=build --chown=65532:65532 /data /data
ENV IDEM_ADDR=":8080" \
    IDEM_DATABASE_URL="sqlite:/data/idem.db" \
    IDEM_LOG_FORMAT="json"
USER 65532:65532
EXPOSE 8080
VOLUME ["/data"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/idem", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/idem"]
CMD ["serve"]
