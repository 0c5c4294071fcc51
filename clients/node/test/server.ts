// Starts the real idem server binary for the tests, on embedded SQLite or on
// an isolated schema of the PostgreSQL named by TEST_DATABASE_URL.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The stores the tests run on. */
export type Store = "sqlite" | "postgres";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository root (clients/node/build/test → ../../../..). */
export const repoRoot = resolve(here, "..", "..", "..", "..");

const secret = "node-sdk-test-hs256-secret-0123456789abcdef";

let builtBinary: string | undefined;

/** The server binary: IDEM_BINARY, else built once with `go build ./cmd/server`. */
export function serverBinary(): string {
  if (process.env.IDEM_BINARY) return process.env.IDEM_BINARY;
  if (!builtBinary) {
    const dir = mkdtempSync(join(tmpdir(), "idem-node-bin-"));
    builtBinary = join(dir, "idem");
    execFileSync("go", ["build", "-o", builtBinary, "./cmd/server"], { cwd: repoRoot, stdio: "inherit" });
    process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  }
  return builtBinary;
}

/**
 * The stores to run on: SQLite always; PostgreSQL when TEST_DATABASE_URL is
 * set. With IDEM_REQUIRE_POSTGRES=1 (make test) a missing server throws,
 * so PostgreSQL coverage can never silently disappear.
 */
export function stores(): Store[] {
  if (process.env.TEST_DATABASE_URL) return ["sqlite", "postgres"];
  if (process.env.IDEM_REQUIRE_POSTGRES === "1") {
    throw new Error("TEST_DATABASE_URL is not set but IDEM_REQUIRE_POSTGRES=1: the PostgreSQL tests must run");
  }
  console.error("# TEST_DATABASE_URL is not set: running on SQLite only (make test runs both stores)");
  return ["sqlite"];
}

/** A running server with one tenant and a keys:write token for it. */
export interface Server {
  url: string;
  token: string;
  store: Store;
  /** Mints another token for the tenant (or another tenant created with createTenant). */
  mint(tenant: string, scope: string): string;
  createTenant(id: string, settings?: Record<string, number>): void;
  stop(): Promise<void>;
}

function psql(url: string, sql: string): void {
  execFileSync("psql", [url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], { stdio: ["ignore", "ignore", "inherit"] });
}

/**
 * Starts `idem serve` on 127.0.0.1:0 for store with a tenant "t1" (its
 * settings from tenantSettings, e.g. {"lease-seconds-default": 2}) and
 * waits until it listens; serverEnv adds IDEM_* settings of the server.
 */
export async function startServer(store: Store, tenantSettings: Record<string, number> = {}, serverEnv: Record<string, string> = {}): Promise<Server> {
  const bin = serverBinary();
  const dir = mkdtempSync(join(tmpdir(), "idem-node-srv-"));
  let dbURL: string;
  let dropSchema = () => {};
  if (store === "postgres") {
    const base = process.env.TEST_DATABASE_URL;
    if (!base) throw new Error("TEST_DATABASE_URL is not set");
    const schema = "idem_node_" + randomBytes(6).toString("hex");
    psql(base, `CREATE SCHEMA ${schema}`);
    dropSchema = () => {
      try {
        psql(base, `DROP SCHEMA ${schema} CASCADE`);
      } catch (err) {
        console.error(`drop schema ${schema}:`, err);
      }
    };
    const u = new URL(base);
    u.searchParams.set("search_path", schema);
    dbURL = u.toString();
  } else {
    dbURL = "sqlite:" + join(dir, "idem.db");
  }
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("IDEM_")) env[k] = v;
  Object.assign(env, {
    IDEM_DATABASE_URL: dbURL,
    IDEM_JWT_HS256_SECRET: secret,
    IDEM_CREATE_DB: "1", // a fresh store: creating the ledger is expected
    IDEM_ADDR: "127.0.0.1:0",
    IDEM_LOG_FORMAT: "json",
    IDEM_LOG_LEVEL: "warn",
    ...serverEnv,
  });
  const cli = (...args: string[]) => execFileSync(bin, args, { env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }).trim();
  const createTenant = (id: string, settings: Record<string, number> = {}) => {
    const flags = Object.entries(settings).flatMap(([k, v]) => [`--${k}`, String(v)]);
    cli("tenant", "create", id, ...flags);
  };
  const mint = (tenant: string, scope: string) => cli("token", "--tenant", tenant, "--scope", scope, "--ttl", "1h");
  createTenant("t1", tenantSettings);
  const token = mint("t1", "keys:write keys:read");

  const child: ChildProcess = spawn(bin, ["serve"], { env: { ...env, IDEM_LOG_LEVEL: "info" }, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const url = await new Promise<string>((resolveURL, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server did not report its address within 30 s:\n${log}`)), 30_000);
    const rl = createInterface({ input: child.stderr! });
    rl.on("line", (line) => {
      if (log.length < 20_000) log += line + "\n";
      try {
        const rec = JSON.parse(line) as { msg?: string; addr?: string };
        if (rec.msg === "listening" && rec.addr) {
          clearTimeout(timer);
          resolveURL("http://" + rec.addr);
        }
      } catch {
        // not a JSON line
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited (${code}) before listening:\n${log}`));
    });
  });
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  return {
    url,
    token,
    store,
    mint,
    createTenant,
    async stop() {
      child.kill("SIGKILL");
      await exited;
      dropSchema();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
