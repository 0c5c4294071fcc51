// The bounds of one logical call, shared by the client core (client.ts) and
// the lifecycle helper (run.ts) without either importing the other's module
// for them.
export {};
