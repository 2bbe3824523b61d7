/**
 * Single sign-on end to end with the real binaries: `gateway start` with auth_service.authentication naming an
 * OIDC connector created with `gwctl create`, a real OpenID provider (oidc-provider) that the Auth Service reaches
 * only through squid (HTTPS_PROXY; its name resolves in squid's hosts_file alone, so a direct dial cannot pass),
 * /webapi/ping reporting the connector, and `gwsh login --auth=corp` finishing through its loopback callback while
 * the test plays the browser with HTTP requests. Hostile: the browser's callback replayed, a callback to gwsh
 * without a code, callbacks to gwsh without its state or with another sent before the real one (gwsh keeps
 * waiting), and a sign-in through a connector that does not exist. Then database users from the identity provider:
 * a role templated on {{external.groups}}, psql through `gwsh proxy db` as the user the groups name, and refused
 * (GW_ERR_DB_USER_DENIED, enforced by the agent) as any other.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPostgres } from '../helpers/databases.js';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { request, startOidcIdp, type OidcIdp } from '../helpers/sso.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { waitUntil } from '../helpers/wait.js';

const IDP = { name: 'idp.sso.test', ip: '127.0.0.5' };
let dir: string;
let pki: TestPki;
let squid: Squid;
let idp: OidcIdp;
let gateway: RunningGateway;
let web: string;
let hostCa: string;
let pin: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-sso-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${IDP.ip} ${IDP.name}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  pki = await makeTestPki();
  const port = await getPort({ host: '127.0.0.1' });
  web = `127.0.0.1:${port}`;
  idp = await startOidcIdp(pki, { redirectUri: `https://${web}/webapi/sso/oidc/callback`, groups: (u) => (u === 'alice' ? ['admins'] : []), host: IDP });
  gateway = await startGateway([
    'gateway:',
    '  nodename: sso-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: debug }',
    'auth_service:',
    '  cluster_name: sso.example',
    '  listen_addr: 127.0.0.1:0',
    '  authentication: { type: oidc, connector_name: corp }',
    'proxy_service:',
    `  web_listen_addr: ${web}`,
    `  public_addr: ${web}`,
    '',
  ].join('\n'), { env: { HTTPS_PROXY: squid.url } });
  hostCa = await readFile(join(gateway.dataDir, 'admin', 'host-ca.pem'), 'utf8');
  const manifest = join(dir, 'corp.yaml');
  await writeFile(manifest, [
    'kind: oidc',
    'version: v3',
    'metadata: { name: corp }',
    'spec:',
    `  issuer_url: ${idp.issuer}`,
    `  client_id: ${idp.clientId}`,
    `  client_secret: ${idp.clientSecret}`,
    `  redirect_url: https://${web}/webapi/sso/oidc/callback`,
    '  display: Corporate SSO',
    '  scope: [email, groups]',
    '  ca: |',
    ...pki.caPem.trim().split('\n').map((l) => `    ${l}`),
    '  claims_to_roles:',
    '    - { claim: groups, value: admins, roles: [editor, access] }',
    '',
  ].join('\n'));
  const created = await runCli('gwctl', ['--data-dir', gateway.dataDir, 'create', manifest], { env: { HOME: dir } });
  expect(created.status, created.stderr).toBe(0);
  pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec((await runCli('gwctl', ['--data-dir', gateway.dataDir, 'status'], { env: { HOME: dir } })).stdout)![1]!;
}, 90_000);

afterAll(async () => {
  await gateway?.stop();
  await idp?.close();
  await squid?.stop();
  await pki?.cleanup();
  await rm(dir, { recursive: true, force: true });
});

/** The browser comes back from the provider to the Proxy's callback (TLS with the cluster's host CA). */
const toProxy = (url: string) => request(url, { ca: hostCa, headers: { accept: 'text/html' } });

describe('single sign-on through the real daemon', () => {
  it('/webapi/ping reports the configured OIDC connector; /webapi/connectors lists it', async () => {
    const ping = (await request(`https://${web}/webapi/ping`, { ca: hostCa })).json();
    expect(ping.auth).toEqual({ type: 'oidc', second_factor: 'off', local: { name: '' }, connector: { kind: 'oidc', name: 'corp', display: 'Corporate SSO' } });
    expect((await request(`https://${web}/webapi/connectors`, { ca: hostCa })).json()).toEqual({ connectors: [{ kind: 'oidc', name: 'corp', display: 'Corporate SSO' }], default: 'corp' });
  });

  it('gwsh login --auth=corp prints the URL, gets the code on 127.0.0.1, and writes the profile; the Auth Service went through squid', async () => {
    const home = join(dir, 'alice-gwsh');
    const child = spawn(process.execPath, [BIN('gwsh'), 'login', `--proxy=${web}`, '--auth=corp', `--ca-pin=${pin}`], { env: { PATH: process.env.PATH ?? '', HOME: dir, GWSH_HOME: home }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c));
    child.stderr.on('data', (c: Buffer) => (err += c));
    const exited = new Promise<number | null>((r) => child.once('close', r));
    const url = await new Promise<string>((resolve, reject) => {
      const check = () => {
        const m = /Open this URL in your browser: (\S+)/.exec(out);
        if (m) resolve(m[1]!);
      };
      child.stdout.on('data', check);
      child.once('close', () => reject(new Error(`gwsh ended first:\n${out}\n${err}`)));
    });
    expect(url.startsWith(`${idp.issuer}/auth?`)).toBe(true);

    const callback = await idp.signIn(url, 'alice');
    const back = await toProxy(callback);
    expect(back.status, back.text).toBe(302);
    expect(back.location).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/callback\?state=[A-Za-z0-9_-]{43}&code=[A-Za-z0-9_-]{43}$/);
    const loopback = new URL(back.location!);
    // A page, or anyone, knocking on gwsh's listener without a code does not end it.
    expect((await request(`${loopback.origin}/callback`)).status).toBe(404);
    // Hostile: any local page can send gwsh a code first (it only has to find the port). Without gwsh's state, or
    // with another, it is refused and gwsh keeps waiting for its own.
    for (const query of [`code=${'A'.repeat(43)}`, `state=${'B'.repeat(43)}&code=${'A'.repeat(43)}`, `state=${loopback.searchParams.get('state')!.slice(1)}&code=x`]) {
      const knock = await request(`${loopback.origin}/callback?${query}`);
      expect(knock.status, query).toBe(400);
    }
    expect(child.exitCode).toBeNull();
    const landed = await request(back.location!);
    expect(landed.status).toBe(200);
    expect(landed.text).toContain('Signed in');
    expect(await exited, err).toBe(0);
    expect(err).toContain("ignored a callback without this sign-in's state");
    expect(out).toMatch(/alice@example\.com/);
    expect(out).toMatch(/editor/);

    const status = await runCli('gwsh', ['status', '--format', 'json'], { env: { HOME: dir, GWSH_HOME: home } });
    expect(JSON.parse(status.stdout).active).toMatchObject({ username: 'alice@example.com', roles: ['editor', 'access'] });
    // The provider was reached through squid only (its name resolves nowhere else).
    await squid.waitForAccessLog((line) => line.includes('CONNECT') && line.includes(IDP.name));

    // The browser's callback replayed: the sign-in request was used.
    const replay = await toProxy(callback);
    expect(replay.status).toBe(400);
    expect(replay.text).toContain('GW_ERR_SSO_STATE_INVALID');
  }, 60_000);

  it('gwsh login --auth gives up when the browser never comes back (its deadline), leaving no profile', async () => {
    const home = join(dir, 'never');
    const r = await runCli('gwsh', ['login', `--proxy=${web}`, '--auth=corp', `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: home, GWSH_SSO_TIMEOUT_MS: '300' } });
    expect(r.stdout).toContain('Open this URL in your browser: ');
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('did not come back from the identity provider');
    expect((await runCli('gwsh', ['status'], { env: { HOME: dir, GWSH_HOME: home } })).stderr).toContain('GW_ERR_CLIENT_NOT_LOGGED_IN');
  });

  it('gwsh login --auth with a connector that does not exist fails with its code', async () => {
    const r = await runCli('gwsh', ['login', `--proxy=${web}`, '--auth=nope', `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: join(dir, 'x') } });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_SSO_CONNECTOR_UNKNOWN');
  });
});

// Runs after the sign-in above, with alice's profile from it (groups: admins, from the identity provider).
rootSuite(['dbUsers'])('database users from the identity provider, enforced at the agent', () => {
  it('a role templated on {{external.groups}}: psql gets in as the database user alice\'s groups name, and no other', async () => {
    const home = join(dir, 'alice-gwsh');
    const pgPort = await getPort();
    const pg = await startPostgres({ port: pgPort, user: 'admins' });
    const started: Array<{ stop(): Promise<unknown> }> = [pg];
    const children: ChildProcess[] = [];
    try {
      const role = join(dir, 'access.yaml');
      // A stored role named access replaces the preset one: database users and names from the IdP's groups claim.
      await writeFile(role, ['kind: role', 'version: v7', 'metadata: { name: access }', 'spec:', '  allow:', "    db_labels: { '*': '*' }", "    db_users: ['{{external.groups}}']", "    db_names: ['{{external.groups}}']", ''].join('\n'));
      const gwctl = (args: string[]) => runCli('gwctl', ['--data-dir', gateway.dataDir, ...args], { env: { HOME: dir } });
      expect((await gwctl(['create', '--force', role])).stderr).toBe('');
      const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=db', '--format', 'json'])).stdout) as { token: string }).token;
      const agent = await startGateway(
        ['gateway:', '  nodename: sso-db', '  data_dir: DATA_DIR', '  log: { format: json }', 'db_service:', '  enabled: yes', '  databases:', `    - { name: pg, protocol: postgres, uri: 127.0.0.1:${pgPort} }`, ''].join('\n'),
        { args: ['--token', token, '--ca-pin', pin, '--proxy', web] },
      );
      started.push(agent);
      await agent.waitForLog('reverse tunnel ready', 20_000);
      const proxy = spawn(process.execPath, [BIN('gwsh'), 'proxy', 'db', 'pg', '--port', '0'], { env: { PATH: process.env.PATH ?? '', HOME: dir, GWSH_HOME: home }, stdio: ['ignore', 'pipe', 'pipe'] });
      children.push(proxy);
      let output = '';
      proxy.stdout.on('data', (c: Buffer) => (output += c));
      proxy.stderr.on('data', (c: Buffer) => (output += c));
      await waitUntil('gwsh proxy db', () => /127\.0\.0\.1:(\d+)/.test(output) || proxy.exitCode !== null, 20_000);
      const port = /127\.0\.0\.1:(\d+)/.exec(output)?.[1];
      expect(port, output).toBeDefined();
      const psql = (user: string) => runProgram('psql', [`host=127.0.0.1 port=${port} user=${user} dbname=admins sslmode=disable connect_timeout=10`, '-X', '-At', '-c', 'select current_user'], { PGPASSWORD: pg.password });
      const ok = await psql('admins');
      expect(ok.stderr).toBe('');
      expect(ok.stdout.trim()).toBe('admins');
      const refused = await psql('postgres');
      expect(refused.stderr).toContain('GW_ERR_DB_USER_DENIED');
    } finally {
      for (const c of children) c.kill('SIGKILL');
      for (const s of started.reverse()) await s.stop();
    }
  }, 90_000);
});

/** A program (psql) with PATH and the environment given; resolves with its status and output. */
function runProgram(command: string, args: string[], env: Record<string, string>): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env: { PATH: process.env.PATH ?? '', HOME: dir, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c));
    child.stderr.on('data', (c: Buffer) => (stderr += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.once('error', reject);
    child.once('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}
