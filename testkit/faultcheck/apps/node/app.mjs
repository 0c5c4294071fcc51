// The entry point the fault checker's runner starts (testkit/faultcheck/runner.go,
// AppArgv: apps/node/app.mjs); the app is fcapp.mjs next to it.
import "./fcapp.mjs";
