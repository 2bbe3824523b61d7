// Replaces dist/cli/gateway.js, gwctl.js and gwsh.js (tsc's output) with bundles of themselves: start-up time.
//
// Why: Node 20 loads one file at a time (resolve, stat, read, compile, run) and has no compile cache. An agent's
// `gateway start`, loading only what it runs, still read about 250 files, 190 of them small CommonJS files of the
// pure-JavaScript packages (yaml, semver, pino, commander, ...); bundled, about 60 (ssh2's among them), and its
// start to "gateway started" took some 30-40 ms less (docs/architecture.md, "Start-up"). esbuild only links what
// tsc compiled: tsc stays the one compiler.
//
// - Code splitting: what a command or a role loads with import() when it runs stays a separate file (a chunk),
//   so an agent still loads no Auth Service or Proxy, and `--help` almost nothing.
// - Chunks go next to the programs, in dist/cli/, so that a module's import.meta.url still names a file in
//   dist/cli/ (src/agent/ssh.ts finds dist/cli/gateway.js for `sftp-server` that way).
// - Packages with native code, or loaded from a file path at run time, are left to node_modules: better-sqlite3,
//   node-pty, ssh2 (its optional crypto binding; and src/agent/sftp/stdio.ts requires its SFTP engine by path,
//   which must be the same copy), cpu-features, pg-native, @kubernetes/client-node (large, loaded only in
//   Kubernetes), and kerberos (Negotiate proxy authentication's GSSAPI binding, an optional dependency: where it is
//   not installed the bundle still loads, and a proxy asking for Negotiate gets GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE). pino-pretty is required at run time only for text logs (src/log.ts), from node_modules too.
// - The bundled CommonJS packages require Node's built-ins: `require` comes from createRequire in each file.
// - The other programs (gateway-upgrade, gateway-kube-updater) stay as tsc wrote them: their start is not waited on.
import { build } from 'esbuild';
import { readdirSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const cli = fileURLToPath(new URL('../dist/cli/', import.meta.url));
const PROGRAMS = ['gateway', 'gwctl', 'gwsh'];
const CHUNK_PREFIX = 'bundle-';
const EXTERNAL = ['better-sqlite3', 'node-pty', 'ssh2', 'cpu-features', 'pg-native', '@kubernetes/client-node', 'kerberos'];

// Chunks of an earlier build (their names carry a content hash).
for (const name of readdirSync(cli)) if (name.startsWith(CHUNK_PREFIX)) rmSync(cli + name);

await build({
  entryPoints: PROGRAMS.map((p) => `${cli}${p}.js`),
  outdir: cli,
  allowOverwrite: true,
  entryNames: '[name]',
  chunkNames: `${CHUNK_PREFIX}[name]-[hash]`,
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  external: EXTERNAL,
  banner: { js: "import { createRequire as __gatewayCreateRequire } from 'node:module'; const require = __gatewayCreateRequire(import.meta.url);" },
  sourcemap: 'linked',
  logLevel: 'warning',
});
