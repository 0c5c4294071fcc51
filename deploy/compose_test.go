package deploy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		File string `yaml:"file"`
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
	require.Subset(t, keys(c.Services), []string{"postgres", "idem", "prometheus", "grafana"})

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
			require.FileExists(t, sec.File, "secret %s", s)
		}
	}
}

// TestComposeWiring checks the links between the services: the database URL
// points at the postgres service, Prometheus scrapes idem and loads the alert
// rules, Grafana gets the shipped dashboard.
func TestComposeWiring(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	idem := c.Services["idem"]
	require.True(t, strings.HasPrefix(idem.Environment["IDEM_DATABASE_URL"], "postgres://"))
	require.Contains(t, idem.Environment["IDEM_DATABASE_URL"], "@postgres:5432/")
	require.Equal(t, "/run/secrets/jwks.json", idem.Environment["IDEM_JWT_JWKS_FILE"])
	require.Equal(t, "postgres:15", c.Services["postgres"].Image)

	prom, err := os.ReadFile("compose/prometheus.yml")
	require.NoError(t, err)
	var promCfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(prom, &promCfg))
	require.Contains(t, promCfg.RuleFiles, "/etc/prometheus/alerts.yml")
	require.Equal(t, "/metrics", promCfg.ScrapeConfigs[0].MetricsPath)
	require.Contains(t, promCfg.ScrapeConfigs[0].StaticConfigs[0].Targets, "idem:8080")
	require.Contains(t, c.Services["prometheus"].Volumes, "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro")

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
