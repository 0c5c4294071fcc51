package deploy_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// composeFile is the part of the compose schema this test reads.
type composeFile struct {
	Services map[string]struct {
		Image string `yaml:"image"`
		Build *struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Secrets     []string          `yaml:"secrets"`
		Command     []string          `yaml:"command"`
	} `yaml:"services"`
	Secrets map[string]struct {
		File        string `yaml:"file"`
		Environment string `yaml:"environment"`
	} `yaml:"secrets"`
	Volumes map[string]any `yaml:"volumes"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile("compose.yaml")
	require.NoError(t, err)
	var c composeFile
	require.NoError(t, yaml.Unmarshal(raw, &c))
	return c
}

// TestComposeReferencesExist checks that every file or folder the compose
// stack mounts, builds from or loads as a secret is in the repository.
func TestComposeReferencesExist(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	require.Subset(t, keys(c.Services), []string{"postgres", "idem", "prometheus", "grafana", "alertmanager"})

	for name, svc := range c.Services {
		if svc.Build != nil {
			require.DirExists(t, svc.Build.Context, "service %s: build context", name)
			require.FileExists(t, filepath.Join(svc.Build.Context, svc.Build.Dockerfile), "service %s: Dockerfile", name)
		}
		for _, v := range svc.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, ".") {
				_, named := c.Volumes[src]
				require.True(t, named, "service %s: volume %q is neither a path nor a declared volume", name, src)
				continue
			}
			_, err := os.Stat(src)
			require.NoError(t, err, "service %s mounts %s", name, src)
		}
		for _, s := range svc.Secrets {
			sec, ok := c.Secrets[s]
			require.True(t, ok, "service %s: undeclared secret %s", name, s)
			if sec.Environment != "" {
				continue // from the environment of docker compose, checked in TestComposeWiring
			}
			require.FileExists(t, sec.File, "secret %s", s)
		}
		// Every *_FILE variable points at a mounted secret of the service
		// or a file its volumes bring.
		for k, v := range svc.Environment {
			if !strings.HasSuffix(k, "_FILE") {
				continue
			}
			sec, isSecret := strings.CutPrefix(v, "/run/secrets/")
			require.True(t, isSecret, "service %s: %s=%s is not a secret", name, k, v)
			require.Contains(t, svc.Secrets, sec, "service %s: %s names secret %s, which it does not mount", name, k, sec)
		}
	}
	// The files the mounted configs name exist too.
	prom := loadPrometheus(t)
	require.Equal(t, []string{"/etc/prometheus/alerts.yml"}, prom.RuleFiles)
}

// promConfig is the part of the Prometheus configuration the tests read.
type promConfig struct {
	RuleFiles []string `yaml:"rule_files"`
	Alerting  struct {
		Alertmanagers []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"alertmanagers"`
	} `yaml:"alerting"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func loadPrometheus(t *testing.T) promConfig {
	t.Helper()
	raw, err := os.ReadFile("compose/prometheus.yml")
	require.NoError(t, err)
	var p promConfig
	require.NoError(t, yaml.Unmarshal(raw, &p))
	return p
}

// exactTag matches an image pinned to an exact release: a tag with at
// least major.minor.patch (postgres: major.minor, its exact release
// numbering), never "latest" or a bare major version.
var exactTag = regexp.MustCompile(`^[a-z0-9./-]+:v?\d+\.\d+(\.\d+)?(-[a-z0-9]+)?$`)

// TestComposeImagesPinned: every image names an exact version.
func TestComposeImagesPinned(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	for name, svc := range c.Services {
		if svc.Build != nil {
			continue
		}
		require.Regexp(t, exactTag, svc.Image, "service %s", name)
		if !strings.HasPrefix(svc.Image, "postgres:") {
			require.Regexp(t, `:v?\d+\.\d+\.\d+$`, svc.Image, "service %s: major.minor.patch", name)
		}
	}
	require.Regexp(t, `^postgres:15\.\d+`, c.Services["postgres"].Image, "the PostgreSQL major the docs name")
}

// TestComposeConfigsValid checks the mounted Prometheus and Alertmanager
// configurations with their own tools (promtool, amtool; Debian packages
// prometheus and prometheus-alertmanager, installed by
// scripts/install-test-deps). Required under make test.
func TestComposeConfigsValid(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		tool string
		args []string
	}{
		{"promtool", []string{"check", "config", "--syntax-only", "compose/prometheus.yml"}},
		{"amtool", []string{"check-config", "compose/alertmanager.yml"}},
	} {
		path, err := exec.LookPath(c.tool)
		if err != nil {
			if os.Getenv("IDEM_REQUIRE_PROMTOOL") != "" {
				t.Fatalf("%s not found (IDEM_REQUIRE_PROMTOOL is set): run scripts/install-test-deps", c.tool)
			}
			t.Skipf("%s not found; run scripts/install-test-deps", c.tool)
		}
		out, err := exec.CommandContext(ctx, path, c.args...).CombinedOutput()
		require.NoError(t, err, "%s %s:\n%s", c.tool, strings.Join(c.args, " "), out)
	}
}

// TestComposeWiring checks the links between the services: the database URL
// points at the postgres service, Prometheus scrapes idem and loads the alert
// rules, Grafana gets the shipped dashboard.
func TestComposeWiring(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	idem := c.Services["idem"]
	pg := c.Services["postgres"]

	// The database password: one compose secret, read by both sides from a
	// file, never written into the URL or an environment variable.
	dbURL := idem.Environment["IDEM_DATABASE_URL"]
	require.True(t, strings.HasPrefix(dbURL, "postgres://idem@postgres:5432/"), dbURL)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	_, hasPassword := u.User.Password()
	require.False(t, hasPassword, "no password in IDEM_DATABASE_URL")
	require.Equal(t, "/run/secrets/postgres_password", idem.Environment["IDEM_DATABASE_PASSWORD_FILE"])
	require.Equal(t, "/run/secrets/postgres_password", pg.Environment["POSTGRES_PASSWORD_FILE"])
	require.NotContains(t, pg.Environment, "POSTGRES_PASSWORD")
	require.Equal(t, "idem", pg.Environment["POSTGRES_USER"])
	require.Equal(t, "IDEM_POSTGRES_PASSWORD", c.Secrets["postgres_password"].Environment)
	raw, err := os.ReadFile("compose.yaml")
	require.NoError(t, err)
	require.NotContains(t, string(raw), "idem:idem", "the old fixed password")
	require.Equal(t, "/run/secrets/jwks.json", idem.Environment["IDEM_JWT_JWKS_FILE"])

	// idem serves /metrics on its internal address, Prometheus scrapes it
	// there, loads the rules and sends alerts to Alertmanager.
	require.Equal(t, ":9464", idem.Environment["IDEM_METRICS_ADDR"])
	prom := loadPrometheus(t)
	require.Equal(t, "/metrics", prom.ScrapeConfigs[0].MetricsPath)
	require.Equal(t, []string{"idem:9464"}, prom.ScrapeConfigs[0].StaticConfigs[0].Targets)
	require.Contains(t, c.Services["prometheus"].Volumes, "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro")
	require.Equal(t, []string{"alertmanager:9093"}, prom.Alerting.Alertmanagers[0].StaticConfigs[0].Targets)
	am := c.Services["alertmanager"]
	require.Contains(t, am.Volumes, "./compose/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro")
	require.Contains(t, am.Command, "--config.file=/etc/alertmanager/alertmanager.yml")
	var amCfg struct {
		Route struct {
			Receiver string `yaml:"receiver"`
		} `yaml:"route"`
		Receivers []map[string]any `yaml:"receivers"`
	}
	raw, err = os.ReadFile("compose/alertmanager.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &amCfg))
	require.Equal(t, "null", amCfg.Route.Receiver)
	require.Equal(t, []map[string]any{{"name": "null"}}, amCfg.Receivers, "a no-op receiver")

	dashboards, err := filepath.Glob("grafana/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, dashboards, "grafana/ must hold the dashboard Grafana provisions")
}

func keys[M ~map[string]V, V any](m M) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
