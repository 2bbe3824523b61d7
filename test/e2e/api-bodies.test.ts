/**
 * The Auth API decides who may ask before it reads what is asked: a body is read only after the caller's
 * identity (as it stands now) and role checks, up to the endpoint's own size limit, and nesting is bounded
 * before any parser runs (issue: hardening, "authorize before parsing").
 */
import https from 'node:https';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';

let gw: RunningGateway;
let dir: string;
const PASSWORD = 'a long enough password';

interface Creds {
  cert: string;
  key: string;
  ca: string;
}
let access: Creds;
let editor: Creds;

function post(creds: Creds | undefined, path: string, body: string | Buffer): Promise<{ status: number; code?: string; ms: number }> {
  const [host, port] = [gw.addresses.auth!.split(':')[0]!, Number(gw.addresses.auth!.split(':')[1])];
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const req = https.request(
      { host, port, path, method: 'POST', ca: readFileSync(join(gw.dataDir, 'admin', 'host-ca.pem')), ...(creds ? { cert: creds.cert, key: creds.key } : {}), headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, code: (JSON.parse(text || '{}') as { error?: { code?: string } }).error?.code, ms: Date.now() - started }));
      },
    );
    req.on('error', (err: NodeJS.ErrnoException) => (err.code === 'EPIPE' || err.code === 'ECONNRESET' ? resolve({ status: -1, ms: Date.now() - started }) : reject(err)));
    req.end(body);
  });
}

async function signIn(user: string, roles: string): Promise<Creds> {
  const admin = ['--data-dir', gw.dataDir];
  expect((await runCli('gwctl', [...admin, 'users', 'add', user, `--roles=${roles}`], { input: `${PASSWORD}\n` })).status).toBe(0);
  const home = join(dir, user);
  const login = await runCli('gwsh', ['login', `--proxy=${gw.addresses.web}`, `--user=${user}`, `--ca-pin=${(/CA pin:\s+(\S+)/.exec((await runCli('gwctl', [...admin, 'status'])).stdout))![1]}`], {
    env: { GWSH_HOME: home, HOME: dir },
    input: `${PASSWORD}\n`,
  });
  expect(login.stderr).toBe('');
  return { cert: readFileSync(join(home, 'cert.pem'), 'utf8'), key: readFileSync(join(home, 'key.pem'), 'utf8'), ca: '' };
}

const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${gw.process.pid}/status`, 'utf8'))![1]) * 1024;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-api-bodies-'));
  gw = await startGateway(['gateway:', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  listen_addr: 127.0.0.1:0', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'));
  access = await signIn('ann', 'access');
  editor = await signIn('eddie', 'editor');
}, 60_000);

afterAll(async () => {
  await gw?.stop();
  await rm(dir, { recursive: true, force: true });
});

/** 1 MiB of YAML block sequences, one inside the other: what cost 1.5-3 s and a gigabyte to parse. */
const NESTED_MANIFEST = JSON.stringify({ manifest: `kind: role\nspec:\n${'- '.repeat(512 * 1024)}x\n` });

describe('authorize before parsing', () => {
  it('a 1 MiB deeply nested manifest from an access-only user is refused (403) before it is parsed', async () => {
    const before = rss();
    const r = await post(access, '/v1/resources', NESTED_MANIFEST);
    expect([r.status, r.code]).toEqual([403, 'GW_ERR_ACCESS_DENIED']);
    expect(rss() - before).toBeLessThan(128 * 1024 * 1024);
  });

  it('the same manifest from an editor is refused (400) by the nesting bound, not parsed', async () => {
    const before = rss();
    const r = await post(editor, '/v1/resources', NESTED_MANIFEST);
    expect([r.status, r.code]).toEqual([400, 'GW_ERR_API_BAD_REQUEST']);
    expect(rss() - before).toBeLessThan(128 * 1024 * 1024);
  });

  it('a user whose roles write nothing (auditor) is refused before a small manifest is read, too', async () => {
    const nobody = await signIn('nora', 'auditor');
    expect((await post(nobody, '/v1/resources', JSON.stringify({ manifest: 'kind: role\nmetadata: {name: x}\n' }))).code).toBe('GW_ERR_ACCESS_DENIED');
  });

  it('a body without a client certificate on an authenticated route is refused before it is read', async () => {
    const r = await post(undefined, '/v1/tokens', JSON.stringify({ roles: ['node'] }));
    expect(r.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
  });
});

describe('per-endpoint body limits and nesting', () => {
  it('a token request over 16 KiB is 413 (a manifest may be 1 MiB, a token request is a few fields)', async () => {
    const r = await post(editor, '/v1/tokens', JSON.stringify({ roles: ['node'], pad: 'x'.repeat(20_000) }));
    expect([r.status, r.code]).toEqual([413, 'GW_ERR_API_TOO_LARGE']);
  });

  it('a login body nested 1000 deep is 400, and the daemon answers the next request', async () => {
    const r = await post(undefined, '/webapi/login', `{"username":${'['.repeat(1000)}${']'.repeat(1000)}}`);
    expect([r.status, r.code]).toEqual([400, 'GW_ERR_API_BAD_REQUEST']);
    const ok = await post(editor, '/v1/tokens', JSON.stringify({ roles: ['node'] }));
    expect(ok.status).toBe(200);
  });

  it('a login body over 64 KiB is 413', async () => {
    const r = await post(undefined, '/webapi/login', JSON.stringify({ username: 'a', password: 'x'.repeat(70_000) }));
    expect(r.status === 413 || r.status === -1).toBe(true);
  });
});
