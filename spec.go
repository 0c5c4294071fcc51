package idem

import _ "embed"

// OpenAPISpec is the OpenAPI 3.0 description of the HTTP contract
// (openapi.yaml at the repository root), served at GET /openapi.yaml and used
// by the contract tests.
//
//go:embed openapi.yaml
var OpenAPISpec []byte
