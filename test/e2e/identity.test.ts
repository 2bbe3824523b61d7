/**
 * Cluster identity end to end, with the real binaries: an admin on the auth machine creates a user with gwctl;
 * the user signs in with gwsh through a real squid; roles, the seed's cluster_maintenance_config rule and the
 * "sign out and in again" behaviour; an agent joins through squid with a token and the CA pin, and a wrong pin
 * or a used-up token is refused. Hardening: a removed user's certificate is refused at once; gwctl lock and
 * unlock on users and roles, and a lock that expires; a bad join burns no token; parallel wrong joins and
 * logins from one address are limited.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { existsSync, readFileSync, statSync } from 'node:fs';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, startGatewayExpectingFailure, type RunningGateway } from '../helpers/gateway.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { generateKeyPair } from '../../src/auth/pki.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'proxy.gw.test';
const PASSWORD = 'correct horse battery';

let dir: string;
let squid: Squid;
let cluster: RunningGateway;
let proxyAddr: string;
let pin: string;
let adminEnv: Record<string, string>;
let aliceEnv: Record<string, string>;

const gwctlAdmin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: adminEnv, ...(input === undefined ? {} : { input }) });
const gwctlAlice = (args: string[]) => runCli('gwctl', args, { env: aliceEnv });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-id-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  const webPort = await getPort({ host: PROXY_IP });
  proxyAddr = `${PROXY_NAME}:${webPort}`;
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: auth-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: debug }',
      'auth_service:',
      '  cluster_name: e2e.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${webPort}`,
      `  public_addr: ${proxyAddr}`,
      '',
    ].join('\n'),
  );
  adminEnv = { HOME: dir };
  // alice's own machine: her profile, and the corporate squid as the only way out.
  aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh'), HTTPS_PROXY: squid.url };
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
  await squid?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('admin on the auth machine', () => {
  it('gwctl status prints the cluster name, version and CA pin with the local admin identity', async () => {
    const r = await gwctlAdmin(['status']);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/Cluster:\s+e2e\.example/);
    expect(r.stdout).toMatch(/Version:\s+17\.0\.0-dev/);
    pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(r.stdout)![1]!;
  });

  it('keeps the backend and keys private', () => {
    expect(statSync(join(cluster.dataDir, 'backend.sqlite')).mode & 0o777).toBe(0o600);
    expect(statSync(join(cluster.dataDir, 'admin', 'key.pem')).mode & 0o777).toBe(0o600);
  });

  it('creates a user, reading the password from standard input', async () => {
    const r = await gwctlAdmin(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const ls = await gwctlAdmin(['users', 'ls', '--format', 'json']);
    expect(JSON.parse(ls.stdout)).toEqual([expect.objectContaining({ metadata: expect.objectContaining({ name: 'alice' }), spec: expect.objectContaining({ roles: ['access'] }) })]);
  });

  it('refuses a role that does not exist and a short password, changing nothing', async () => {
    const r1 = await gwctlAdmin(['users', 'add', 'bob', '--roles=nope'], `${PASSWORD}\n`);
    expect(r1.status).toBe(1);
    expect(r1.stderr).toContain('GW_ERR_RESOURCE_NOT_FOUND');
    const r2 = await gwctlAdmin(['users', 'add', 'bob', '--roles=access'], 'short\n');
    expect(r2.status).toBe(1);
    expect(r2.stderr).toContain('GW_ERR_AUTH_WEAK_PASSWORD');
    const ls = await gwctlAdmin(['users', 'ls', '--format', 'json']);
    expect((JSON.parse(ls.stdout) as unknown[]).length).toBe(1);
  });
});

describe('alice signs in through squid', () => {
  it('a wrong password is refused without saying whether the user exists', async () => {
    const wrong = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: 'wrong password\n' });
    const nobody = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=nobody', `--ca-pin=${pin}`], { env: aliceEnv, input: 'wrong password\n' });
    expect(wrong.status).toBe(1);
    expect(wrong.stderr).toContain('GW_ERR_AUTH_LOGIN_FAILED');
    expect(nobody.stderr.replace('nobody', 'alice')).toBe(wrong.stderr);
  });

  it('logs in with gwsh through squid, and squid saw the CONNECT', async () => {
    const r = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    await squid.waitForAccessLog((l) => l.includes(`CONNECT ${proxyAddr} 200`));
    expect(statSync(join(aliceEnv.GWSH_HOME!, 'key.pem')).mode & 0o777).toBe(0o600);
  });

  it('gwsh status -f json shows her user, roles, cluster, validity and proxy', async () => {
    const r = await runCli('gwsh', ['status', '-f', 'json'], { env: aliceEnv });
    expect(r.status).toBe(0);
    const { active } = JSON.parse(r.stdout) as { active: Record<string, unknown> };
    expect(active).toMatchObject({ username: 'alice', roles: ['access'], cluster: 'e2e.example', proxy: proxyAddr });
    const validUntil = Date.parse(active.valid_until as string);
    expect(validUntil - Date.now()).toBeGreaterThan(11 * 3600_000);
    expect(validUntil - Date.now()).toBeLessThanOrEqual(12 * 3600_000);
  });
});

describe('cluster_maintenance_config needs a role with that rule, and a new login', () => {
  const maintenance = ['kind: cluster_maintenance_config', 'spec:', '  agent_upgrades:', '    utc_start_hour: 2', '    weekdays: [Mon, Wednesday, fri]', ''].join('\n');
  const role = [
    'kind: role',
    'version: v7',
    'metadata:',
    '  name: maintenance-admin',
    'spec:',
    '  allow:',
    '    rules:',
    '      - resources: [cluster_maintenance_config]',
    '        verbs: [create, read, update, delete]',
    '',
  ].join('\n');
  let maintenanceFile: string;

  beforeAll(async () => {
    maintenanceFile = join(dir, 'maintenance.yaml');
    await writeFile(maintenanceFile, maintenance);
    await writeFile(join(dir, 'role.yaml'), role);
  });

  it('alice (role access) cannot create it; the refusal names the missing rule', async () => {
    const r = await gwctlAlice(['create', maintenanceFile]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_ACCESS_DENIED');
    expect(r.stderr).toContain('cluster_maintenance_config');
  });

  it('the admin creates the role and gives it to alice', async () => {
    expect((await gwctlAdmin(['create', join(dir, 'role.yaml')])).status).toBe(0);
    const r = await gwctlAdmin(['users', 'update', 'alice', '--set-roles', 'access,maintenance-admin']);
    expect(r.status).toBe(0);
  });

  it('her current certificate keeps the old roles until she signs in again', async () => {
    const status = JSON.parse((await runCli('gwsh', ['status', '-f', 'json'], { env: aliceEnv })).stdout) as { active: { roles: string[] } };
    expect(status.active.roles).toEqual(['access']);
    const r = await gwctlAlice(['create', maintenanceFile]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_ACCESS_DENIED');
  });

  it('after logout and login she can, and the answer says the window was updated', async () => {
    expect((await runCli('gwsh', ['logout'], { env: aliceEnv })).stdout).toContain('logged out');
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
    expect(login.stderr).toBe('');
    expect(login.status).toBe(0);
    const status = JSON.parse((await runCli('gwsh', ['status', '-f', 'json'], { env: aliceEnv })).stdout) as { active: { roles: string[] } };
    expect(status.active.roles).toEqual(['access', 'maintenance-admin']);
    const r = await gwctlAlice(['create', maintenanceFile]);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('maintenance window has been updated');
    const get = await gwctlAlice(['get', 'cluster_maintenance_config', '--format', 'json']);
    expect(get.status).toBe(0);
    expect(JSON.parse(get.stdout)).toEqual([expect.objectContaining({ spec: { agent_upgrades: { utc_start_hour: 2, weekdays: ['Mon', 'Wed', 'Fri'] } } })]);
  });

  it('a bad manifest names the document and field and changes nothing', async () => {
    const bad = join(dir, 'bad.yaml');
    await writeFile(bad, `${role.replace('maintenance-admin', 'second')}---\n${maintenance.replace('utc_start_hour: 2', 'utc_start_hour: 24')}`);
    const r = await gwctlAdmin(['create', '-f', bad]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_RESOURCE_INVALID');
    expect(r.stderr).toContain('document 2');
    expect(r.stderr).toContain('utc_start_hour');
    const roles = await gwctlAdmin(['get', 'role', '--format', 'json']);
    expect(roles.stdout).not.toContain('"second"');
  });
});

describe('an agent joins with a token and the CA pin, through squid', () => {
  const agentConfig = (name: string) => ['gateway:', `  nodename: ${name}`, '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n');
  let token: string;

  it('gwctl tokens add prints the token, the pin and a ready command line', async () => {
    const r = await gwctlAdmin(['tokens', 'add', '--type=node', '--ttl=10m', '--format', 'json']);
    expect(r.status).toBe(0);
    const out = JSON.parse(r.stdout) as { token: string; ca_pin: string; command: string };
    expect(out.ca_pin).toBe(pin);
    expect(out.command).toContain(`--token=${out.token}`);
    expect(out.command).toContain(`--ca-pin=${pin}`);
    expect(out.command).toContain(`--proxy=${proxyAddr}`);
    token = out.token;
  });

  it('a wrong pin is refused before the token is sent (the token still works afterwards)', async () => {
    const wrongPin = `sha256:${'0'.repeat(64)}`;
    const r = await startGatewayExpectingFailure(agentConfig('node-wrong-pin'), ['--token', token, '--ca-pin', wrongPin, '--proxy', proxyAddr], { HTTPS_PROXY: squid.url });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_AUTH_PIN_MISMATCH');
    expect(existsSync(join(r.dataDir, 'host', 'cert.pem'))).toBe(false);
  });

  it('joins through squid, stores its identity, and gwctl get nodes lists it', async () => {
    const agent = await startGateway(agentConfig('node-1'), { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr], env: { HTTPS_PROXY: squid.url } });
    try {
      expect(agent.hostId).toMatch(/^[0-9a-f-]{36}$/);
      expect(statSync(join(agent.dataDir, 'host', 'key.pem')).mode & 0o777).toBe(0o600);
      await squid.waitForAccessLog((l) => l.includes(`CONNECT ${proxyAddr} 200`));
      // Its reverse tunnel comes up through squid too, and gwctl get nodes shows it online.
      await agent.waitForLog('reverse tunnel ready');
      const nodes = await gwctlAdmin(['get', 'nodes', '--format', 'json']);
      expect(JSON.parse(nodes.stdout)).toContainEqual(
        expect.objectContaining({ metadata: expect.objectContaining({ name: agent.hostId }), spec: expect.objectContaining({ hostname: 'node-1', roles: ['node'], status: 'online' }) }),
      );
      expect(agent.logs()).not.toContain(token);
      expect(cluster.logs()).not.toContain(token);
    } finally {
      await agent.stop();
    }
  });

  it('a used-up token is refused with a clear error', async () => {
    const r = await startGatewayExpectingFailure(agentConfig('node-2'), ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr], { HTTPS_PROXY: squid.url });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_AUTH_TOKEN_USED');
    expect(r.stderr).not.toContain(token);
  });

  it('an unknown token and a token of the wrong type are refused', async () => {
    const unknown = await startGatewayExpectingFailure(agentConfig('node-3'), ['--token', 'f'.repeat(32), '--ca-pin', pin, '--proxy', proxyAddr], { HTTPS_PROXY: squid.url });
    expect(unknown.stderr).toContain('GW_ERR_AUTH_TOKEN_UNKNOWN');
    const dbToken = JSON.parse((await gwctlAdmin(['tokens', 'add', '--type=db', '--format', 'json'])).stdout) as { token: string };
    const wrongType = await startGatewayExpectingFailure(agentConfig('node-4'), ['--token', dbToken.token, '--ca-pin', pin, '--proxy', proxyAddr], { HTTPS_PROXY: squid.url });
    expect(wrongType.stderr).toContain('GW_ERR_AUTH_TOKEN_WRONG_TYPE');
  });

  it('tokens ls shows ids, never token values', async () => {
    const r = await gwctlAdmin(['tokens', 'ls', '--format', 'json']);
    expect(r.status).toBe(0);
    expect(r.stdout).not.toContain(token);
    expect(JSON.parse(r.stdout)).toContainEqual(expect.objectContaining({ roles: ['node'], used: 1, uses: 1 }));
  });
});

describe('certificates from another cluster', () => {
  it("the Auth API refuses a client certificate that another cluster's CA signed", async () => {
    const other = await startGateway(
      ['gateway:', '  nodename: other', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: other.example', '  listen_addr: 127.0.0.1:0', ''].join('\n'),
    );
    try {
      // The other cluster's admin identity, sent to our Auth API (server certificate deliberately not checked:
      // this is about what the server accepts).
      const key = readFileSync(join(other.dataDir, 'admin', 'key.pem'), 'utf8');
      const cert = readFileSync(join(other.dataDir, 'admin', 'cert.pem'), 'utf8');
      const [host, port] = [cluster.addresses.auth!.replace(/:\d+$/, '').replace('0.0.0.0', '127.0.0.1'), Number(/:(\d+)$/.exec(cluster.addresses.auth!)![1])];
      const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = https.request({ host, port, path: '/v1/status', key, cert, rejectUnauthorized: false }, (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        });
        req.on('error', reject);
        req.end();
      });
      expect(answer.status).toBe(401);
      expect(JSON.parse(answer.body)).toMatchObject({ error: { code: 'GW_ERR_AUTH_UNAUTHENTICATED' } });
    } finally {
      await other.stop();
    }
  });
});

/** A raw HTTPS POST to the Proxy's web port from a chosen local address (the source the rate limits key on). */
function post(path: string, body: unknown, localAddress: string): Promise<{ status: number; body: { error?: { code: string; message: string } } }> {
  const port = Number(proxyAddr.slice(proxyAddr.lastIndexOf(':') + 1));
  return new Promise((resolve, reject) => {
    const text = JSON.stringify(body);
    const req = https.request(
      { host: PROXY_IP, port, servername: PROXY_NAME, path, method: 'POST', localAddress, rejectUnauthorized: false, agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) } },
      (res) => {
        let data = '';
        res.on('data', (c: Buffer) => (data += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(data) as { error?: { code: string; message: string } } }));
      },
    );
    req.on('error', reject);
    req.end(text);
  });
}

describe('hardening: a removed user keeps no power', () => {
  const bobEnv = () => ({ HOME: dir, GWSH_HOME: join(dir, 'bob-gwsh'), HTTPS_PROXY: squid.url });
  const gwctlBob = (args: string[], input?: string) => runCli('gwctl', args, { env: bobEnv(), ...(input === undefined ? {} : { input }) });
  const github = ['kind: github', 'version: v3', 'metadata: {name: github}', 'spec:', '  client_id: gw-client', '  client_secret: s3cret-of-the-connector', '  redirect_url: https://proxy.gw.test/v1/webapi/github/callback', '  teams_to_roles: [{organization: acme, team: admins, roles: [editor]}]', ''].join('\n');

  it("bob's certificate is refused at once after 'gwctl users rm bob': tokens, users, --with-secrets", async () => {
    await writeFile(join(dir, 'github.yaml'), github);
    expect((await gwctlAdmin(['create', join(dir, 'github.yaml')])).status).toBe(0);
    expect((await gwctlAdmin(['users', 'add', 'bob', '--roles=editor'], `${PASSWORD}\n`)).status).toBe(0);
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=bob', `--ca-pin=${pin}`], { env: bobEnv(), input: `${PASSWORD}\n` });
    expect(login.status).toBe(0);
    const signedInAt = Date.now();
    // Before: an editor may do all three.
    expect((await gwctlBob(['tokens', 'add', '--type=node', '--format', 'json'])).status).toBe(0);
    expect((await gwctlBob(['get', 'github/github', '--with-secrets', '--format', 'json'])).stdout).toContain('s3cret-of-the-connector');

    expect((await gwctlAdmin(['users', 'rm', 'bob'])).status).toBe(0);
    const token = await gwctlBob(['tokens', 'add', '--type=node', '--format', 'json']);
    expect(token.status).toBe(1);
    expect(token.stderr).toContain('GW_ERR_AUTH_IDENTITY_REVOKED');
    const user = await gwctlBob(['users', 'add', 'mallory', '--roles=editor'], `${PASSWORD}\n`);
    expect(user.status).toBe(1);
    expect(user.stderr).toContain('GW_ERR_AUTH_IDENTITY_REVOKED');
    const secrets = await gwctlBob(['get', 'github/github', '--with-secrets', '--format', 'json']);
    expect(secrets.status).toBe(1);
    expect(secrets.stderr).toContain('GW_ERR_AUTH_IDENTITY_REVOKED');
    expect(secrets.stdout).not.toContain('s3cret-of-the-connector');
    expect((await gwctlAdmin(['users', 'ls', '--format', 'json'])).stdout).not.toContain('mallory');

    // A new bob (certificate times have whole seconds: make sure a second has passed since the old login).
    await new Promise((r) => setTimeout(r, Math.max(0, signedInAt + 2000 - Date.now())));
    expect((await gwctlAdmin(['users', 'add', 'bob', '--roles=editor'], `${PASSWORD}\n`)).status).toBe(0);
    const revived = await gwctlBob(['tokens', 'add', '--type=node', '--format', 'json']);
    expect(revived.status).toBe(1);
    expect(revived.stderr).toContain('GW_ERR_AUTH_IDENTITY_REVOKED');
    expect(revived.stderr).toContain('created again');
  });
});

describe('hardening: gwctl lock and unlock', () => {
  const carolEnv = () => ({ HOME: dir, GWSH_HOME: join(dir, 'carol-gwsh'), HTTPS_PROXY: squid.url });
  const gwctlCarol = (args: string[]) => runCli('gwctl', args, { env: carolEnv() });

  beforeAll(async () => {
    expect((await gwctlAdmin(['users', 'add', 'carol', '--roles=editor'], `${PASSWORD}\n`)).status).toBe(0);
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=carol', `--ca-pin=${pin}`], { env: carolEnv(), input: `${PASSWORD}\n` });
    expect(login.status).toBe(0);
  });

  it('--user: her calls are refused with a code naming the lock; get locks lists it; login is refused; unlock restores', async () => {
    const lock = await gwctlAdmin(['lock', '--user', 'carol', '--message', 'security review']);
    expect(lock.stderr).toBe('');
    const name = /lock "([^"]+)" created/.exec(lock.stdout)![1]!;
    const status = await gwctlCarol(['status']);
    expect(status.status).toBe(1);
    expect(status.stderr).toContain('GW_ERR_ACCESS_LOCKED');
    expect(status.stderr).toContain(name);
    expect(status.stderr).toContain('security review');
    const locks = JSON.parse((await gwctlAdmin(['get', 'locks', '--format', 'json'])).stdout) as Array<{ metadata: { name: string }; spec: Record<string, unknown> }>;
    expect(locks).toEqual([expect.objectContaining({ kind: 'lock', metadata: { name }, spec: expect.objectContaining({ target: { user: 'carol' }, message: 'security review', created_by: 'admin' }) })]);
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=carol', `--ca-pin=${pin}`], { env: { ...carolEnv(), GWSH_HOME: join(dir, 'carol-2') }, input: `${PASSWORD}\n` });
    expect(login.status).toBe(1);
    expect(login.stderr).toContain('GW_ERR_ACCESS_LOCKED');
    // alice is not concerned.
    expect((await gwctlAlice(['status'])).status).toBe(0);

    const unlock = await gwctlAdmin(['unlock', '--user', 'carol']);
    expect(unlock.stdout).toContain(`lock "${name}" has been removed`);
    expect((await gwctlCarol(['status'])).status).toBe(0);
    expect(JSON.parse((await gwctlAdmin(['get', 'locks', '--format', 'json'])).stdout)).toEqual([]);
  });

  it('--role: every user holding the role is refused; unlock by name restores', async () => {
    expect((await gwctlAdmin(['lock', '--role', 'editor', '--name', 'no-editors'])).status).toBe(0);
    const r = await gwctlCarol(['tokens', 'ls']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_ACCESS_LOCKED');
    expect(r.stderr).toContain('no-editors');
    expect((await gwctlAlice(['status'])).status).toBe(0);
    expect((await gwctlAdmin(['unlock', 'no-editors'])).status).toBe(0);
    expect((await gwctlCarol(['tokens', 'ls'])).status).toBe(0);
  });

  it('--ttl: the lock ends by itself', async () => {
    expect((await gwctlAdmin(['lock', '--user', 'carol', '--ttl', '2s'])).status).toBe(0);
    expect((await gwctlCarol(['status'])).stderr).toContain('GW_ERR_ACCESS_LOCKED');
    const deadline = Date.now() + 30_000;
    let last = await gwctlCarol(['status']);
    while (last.status !== 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 500));
      last = await gwctlCarol(['status']);
    }
    expect(last.stderr).toBe('');
    expect(last.status).toBe(0);
  });

  it('refuses a lock without exactly one target, as a usage error', async () => {
    const none = await gwctlAdmin(['lock']);
    expect(none.status).toBe(2);
    expect(none.stderr).toContain('GW_ERR_USAGE');
    expect(none.stderr).toContain('exactly one of --user, --role, --node');
    const two = await gwctlAdmin(['lock', '--user', 'carol', '--role', 'editor']);
    expect(two.status).toBe(2);
    expect(two.stderr).toContain('--user and --role');
  });
});

describe('hardening: joins', () => {
  const agentConfig = (name: string) => ['gateway:', `  nodename: ${name}`, '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n');

  it('a malformed public key answers 400 with a code, and the single-use token still works afterwards', async () => {
    const { token } = JSON.parse((await gwctlAdmin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string };
    const keys = generateKeyPair();
    const bad = await post('/webapi/join', { token, roles: ['node'], nodename: 'bad-key', public_key: '-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n', ssh_public_key: keys.sshPublicKey }, '127.0.0.1');
    expect(bad.status).toBe(400);
    expect(bad.body.error?.code).toBe('GW_ERR_API_BAD_KEY');
    const badSsh = await post('/webapi/join', { token, roles: ['node'], nodename: 'bad-key', public_key: keys.publicKeyPem, ssh_public_key: 'ssh-ed25519 AAAA' }, '127.0.0.1');
    expect(badSsh.status).toBe(400);
    expect(badSsh.body.error?.code).toBe('GW_ERR_API_BAD_KEY');
    const agent = await startGateway(agentConfig('node-after-bad-key'), { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr], env: { HTTPS_PROXY: squid.url } });
    try {
      expect(agent.hostId).toMatch(/^[0-9a-f-]{36}$/);
    } finally {
      await agent.stop();
    }
  });

  it('200 parallel joins with wrong tokens from one address: a few are checked, the rest get 429', async () => {
    const keys = generateKeyPair();
    const attempt = (i: number) => post('/webapi/join', { token: `wrong-token-${i}`, roles: ['node'], nodename: `n${i}`, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey }, '127.0.0.9');
    const answers = await Promise.all(Array.from({ length: 200 }, (_, i) => attempt(i)));
    const checked = answers.filter((a) => a.status === 401);
    expect(checked.length).toBeGreaterThan(0);
    expect(checked.length).toBeLessThanOrEqual(10);
    expect(checked.every((a) => a.body.error?.code === 'GW_ERR_AUTH_TOKEN_UNKNOWN')).toBe(true);
    const limited = answers.filter((a) => a.status === 429);
    expect(limited).toHaveLength(200 - checked.length);
    expect(limited.every((a) => a.body.error?.code === 'GW_ERR_AUTH_RATE_LIMITED')).toBe(true);
    // A valid token from that address waits too.
    const { token } = JSON.parse((await gwctlAdmin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string };
    const valid = await post('/webapi/join', { token, roles: ['node'], nodename: 'late', public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey }, '127.0.0.9');
    expect(valid.status).toBe(429);
  }, 120_000);
});

describe('hardening: logins', () => {
  it('200 parallel logins from one address with the right password among them: at most 5 checked, all others 429', async () => {
    const keys = generateKeyPair();
    const attempt = (i: number) =>
      post('/webapi/login', { username: 'alice', password: i === 100 ? PASSWORD : `wrong password ${i}`, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey }, '127.0.0.10');
    const answers = await Promise.all(Array.from({ length: 200 }, (_, i) => attempt(i)));
    const checked = answers.filter((a) => a.status === 401);
    expect(checked.length).toBeGreaterThan(0);
    expect(checked.length).toBeLessThanOrEqual(5);
    expect(answers.filter((a) => a.status === 429)).toHaveLength(200 - checked.length);
    expect(answers[100]!.status).toBe(429);
    // The lockout is per address: alice signs in from her own.
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
    expect(login.status).toBe(0);
  }, 120_000);
});
