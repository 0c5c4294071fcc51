package api

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client"
)

// TestSDKSettingsAreTheSpecs keeps the tenant settings every typed model
// carries equal to the spec's Settings and SettingsPatch: the domain's
// Settings, the Go SDK's Settings and SettingsPatch, and the Node SDK's
// Settings interface. A setting the server added but an SDK's type left out
// cannot be read or changed through that SDK (retry_budget_percent once
// was); the Python SDK hands settings over as dicts and has no list.
func TestSDKSettingsAreTheSpecs(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(idem.OpenAPISpec)
	require.NoError(t, err)
	props := func(schema string) []string {
		var names []string
		for name := range doc.Components.Schemas[schema].Value.Properties {
			names = append(names, name)
		}
		slices.Sort(names)
		return names
	}
	settings := props("Settings")
	require.NotEmpty(t, settings)
	require.Equal(t, settings, props("SettingsPatch"), "the spec's SettingsPatch names every setting")
	require.Equal(t, settings, jsonNames(reflect.TypeFor[idem.Settings]()), "idem.Settings")
	require.Equal(t, settings, jsonNames(reflect.TypeFor[client.Settings]()), "client.Settings")
	require.Equal(t, settings, jsonNames(reflect.TypeFor[client.SettingsPatch]()), "client.SettingsPatch")

	b, err := os.ReadFile("../clients/node/src/types.ts")
	require.NoError(t, err)
	src := string(b)
	i := strings.Index(src, "export interface Settings {")
	require.GreaterOrEqual(t, i, 0, "types.ts: no Settings interface")
	src = src[i:]
	src = src[:strings.Index(src, "\n}")]
	var node []string
	for _, m := range regexp.MustCompile(`(?m)^  (\w+)\??: `).FindAllStringSubmatch(src, -1) {
		node = append(node, m[1])
	}
	slices.Sort(node)
	require.Equal(t, settings, node, "clients/node/src/types.ts Settings")
}

// jsonNames returns the JSON member names of a struct's fields, sorted.
func jsonNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
