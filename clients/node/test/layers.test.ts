// The SDK's modules import downward only (issue 22): no import circle, and
// the client core (calls, retries, the run lifecycle) never loads the
// middleware (the front-door flow and its Express and fetch adapters), so an
// app that only calls idem does not load a server framework's glue. The
// runtime graph is read from the committed dist/ (run-tests checks it is
// what src/ compiles to; `import type` is erased there); the graph with the
// type-only imports is read from src/.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";

// Compiled to build/test/: the package root is two folders up.
const root = new URL("../../", import.meta.url);

const core = ["client", "run", "retry", "keys", "errors", "types", "response", "bounds"];
const middleware = new Set(["frontdoor", "express", "fetch"]);

// graph maps each module of dir (by base name, no extension) to the
// modules of the package it imports; typeImports false leaves out
// `import type` / `export type` statements.
function graph(dir: string, ext: string, typeImports: boolean): Map<string, string[]> {
  const g = new Map<string, string[]>();
  const folder = new URL(dir, root);
  for (const f of readdirSync(folder).filter((n) => n.endsWith(ext) && !n.endsWith(".d.ts"))) {
    const text = readFileSync(new URL(f, folder), "utf8")
      .replace(/\/\*[\s\S]*?\*\//g, "")
      .replace(/^\s*\/\/.*$/gm, "");
    const deps: string[] = [];
    for (const m of text.matchAll(/(?:^|\n)\s*(import|export)\b(\s+type\b)?(?:[^;'"]*?\bfrom\s*|\s*)["'](\.[^"']+)["']/g)) {
      if (m[2] !== undefined && !typeImports) continue;
      deps.push((m[3] ?? "").replace(/^.*\//, "").replace(/\.js$/, ""));
    }
    g.set(f.slice(0, -ext.length), deps);
  }
  return g;
}

function cycles(g: Map<string, string[]>): string[] {
  const state = new Map<string, number>();
  const found: string[] = [];
  const visit = (n: string, stack: string[]) => {
    state.set(n, 1);
    stack.push(n);
    for (const m of g.get(n) ?? []) {
      if (!g.has(m)) continue;
      if (state.get(m) === 1) found.push([...stack.slice(stack.indexOf(m)), m].join(" -> "));
      else if (!state.has(m)) visit(m, stack);
    }
    stack.pop();
    state.set(n, 2);
  };
  for (const n of g.keys()) if (!state.has(n)) visit(n, []);
  return found;
}

function reaches(g: Map<string, string[]>, from: string): Set<string> {
  const seen = new Set<string>();
  const todo = [from];
  while (todo.length > 0) {
    for (const m of g.get(todo.pop()!) ?? []) {
      if (g.has(m) && !seen.has(m)) {
        seen.add(m);
        todo.push(m);
      }
    }
  }
  return seen;
}

test("the runtime import graph has no circle and the core loads no middleware", () => {
  const g = graph("dist/", ".js", false);
  for (const m of [...core, ...middleware]) assert.ok(g.has(m), `dist/${m}.js is missing: the lists here are stale`);
  assert.deepEqual(cycles(g), []);
  for (const c of core) {
    assert.deepEqual([...reaches(g, c)].filter((m) => middleware.has(m)), [], `${c} loads middleware`);
  }
});

// With the type-only imports too (read from src/): the ResumeCall type lives
// in types.ts, so run.ts does not reach resume.ts and its middleware imports.
test("the import graph with type-only imports has no circle", () => {
  const g = graph("src/", ".ts", true);
  assert.ok(g.size > 5);
  assert.deepEqual(cycles(g), []);
  for (const c of core) {
    assert.deepEqual([...reaches(g, c)].filter((m) => middleware.has(m)), [], `${c} reaches middleware`);
  }
});
