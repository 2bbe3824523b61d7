/**
 * Start-up time (docs/architecture.md, "Start-up"): a process loads the code of what it runs, not the rest. The
 * built programs run with a preload that writes down every file Node loads (ES modules through a loader hook,
 * CommonJS through Module.prototype.load); the lists must not hold the Auth Service, the Proxy, SQLite, pg or the
 * SFTP server where they are not run. Works on tsc's output and on the bundles alike (a role's starter is
 * dist/roles/<role>.js, or the chunk dist/cli/bundle-<role>-<hash>.js; a starter imported statically would be
 * merged into another chunk in the bundle, where better-sqlite3, which stays in node_modules, still shows the
 * Auth Service).
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const GATEWAY = fileURLToPath(new URL('../../dist/cli/gateway.js', import.meta.url));
let dir: string;
let preload: string;
let run = 0;

beforeAll(async () => {
  expect(existsSync(GATEWAY), 'run npm run build first: the test runs dist/cli/gateway.js').toBe(true);
  dir = await mkdtemp(join(tmpdir(), 'gw-startup-'));
  const hook = join(dir, 'hook.mjs');
  await writeFile(
    hook,
    `import { appendFileSync } from 'node:fs';
export async function load(url, context, next) {
  if (url.startsWith('file:') && process.env.GW_LOADED) appendFileSync(process.env.GW_LOADED, url + '\\n');
  return next(url, context);
}
`,
  );
  preload = join(dir, 'preload.cjs');
  await writeFile(
    preload,
    `const Module = require('node:module');
const { appendFileSync } = require('node:fs');
const load = Module.prototype.load;
Module.prototype.load = function (filename) {
  appendFileSync(process.env.GW_LOADED, require('node:url').pathToFileURL(filename).href + '\\n');
  return load.apply(this, arguments);
};
Module.register(${JSON.stringify(pathToFileURL(hook).href)});
`,
  );
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** The files `gateway <args>` loaded (file: URLs), run to its end. */
function loadedBy(args: string[]): { files: string[]; stderr: string; status: number | null } {
  const list = join(dir, `loaded-${run++}.txt`);
  const r = spawnSync(process.execPath, ['--require', preload, GATEWAY, ...args], { encoding: 'utf8', env: { PATH: process.env.PATH ?? '', GW_LOADED: list } });
  return { files: existsSync(list) ? filesIn(list) : [], stderr: r.stderr, status: r.status };
}

/** The distinct entries of a list the preload wrote (a loader hook may see a URL more than once). */
const filesIn = (list: string): string[] => [...new Set(readFileSync(list, 'utf8').split('\n').filter(Boolean))];

const starter = (role: string) => new RegExp(`/dist/(roles/${role}\\.js|cli/bundle-${role}-\\w+\\.js)$`);
const pkg = (name: string) => new RegExp(`/node_modules/${name}/`);
const matching = (files: string[], pattern: RegExp) => files.filter((f) => pattern.test(f));

describe('start-up loads what runs', () => {
  it('an agent (app_service) loads the agent role, and no Auth Service, Proxy, SQLite, pg, SFTP server or ssh2 (tunnel v2 needs none)', async () => {
    const file = join(dir, 'agent.yaml');
    await writeFile(file, `gateway:\n  nodename: agent-1\n  data_dir: ${join(dir, 'agent-data')}\n  log: { format: json }\napp_service:\n  enabled: yes\n  apps:\n    - { name: web, uri: "http://127.0.0.1:9" }\n`);
    // No stored identity and no token: it stops in the agent role, once that role is loaded.
    const r = loadedBy(['start', '-c', file]);
    expect(r.stderr).toContain('GW_ERR_AGENT_IDENTITY');
    expect(r.status).toBe(1);
    expect(matching(r.files, starter('agent'))).toHaveLength(1);
    for (const unwanted of [starter('auth'), starter('proxy'), starter('postgres'), starter('server'), pkg('better-sqlite3'), pkg('pg'), pkg('@kubernetes/client-node'), pkg('pino-pretty'), pkg('ssh2')]) {
      expect(matching(r.files, unwanted), String(unwanted)).toEqual([]);
    }
  });

  it('gateway --help loads no role and no configuration', () => {
    const r = loadedBy(['--help']);
    expect(r.status).toBe(0);
    for (const unwanted of [starter('start'), starter('agent'), starter('auth'), starter('proxy'), /\/dist\/config\//, pkg('yaml'), pkg('pino')]) {
      expect(matching(r.files, unwanted), String(unwanted)).toEqual([]);
    }
  });

  // The detector itself: the Auth Service and the Proxy, started for real, are in the list.
  it('auth + proxy load both starters and SQLite', async () => {
    const file = join(dir, 'cluster.yaml');
    await writeFile(file, `gateway:\n  nodename: node-1\n  data_dir: ${join(dir, 'cluster-data')}\n  log: { format: json }\nauth_service:\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n`);
    const list = join(dir, 'loaded-cluster.txt');
    const child = spawn(process.execPath, ['--require', preload, GATEWAY, 'start', '-c', file], { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: process.env.PATH ?? '', GW_LOADED: list } });
    let stderr = '';
    await new Promise<void>((resolve, reject) => {
      child.stderr!.on('data', (c: Buffer) => {
        stderr += c.toString();
        if (stderr.includes('gateway started')) resolve();
      });
      child.once('exit', (code) => reject(new Error(`exited early with ${code}: ${stderr}`)));
    });
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    const files = filesIn(list);
    expect(matching(files, starter('auth'))).toHaveLength(1);
    expect(matching(files, starter('proxy'))).toHaveLength(1);
    expect(matching(files, pkg('better-sqlite3')).length).toBeGreaterThan(0);
    expect(matching(files, starter('postgres'))).toEqual([]);
  });
});
