// The path of a key: escape it as one path segment, so that "/" and "%" in
// a key stay part of it. Usage: node escape_key.mjs KEY...
for (const key of process.argv.slice(2)) {
  console.log(`/v1/keys/${encodeURIComponent(key)}`);
}
