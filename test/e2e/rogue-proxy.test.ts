/**
 * Issue 23, "What was seen" 1, with the real gwsh and gwctl: a rogue TLS server that holds a real agent's host
 * certificate of the cluster (it chains to the host CA and names the address dialled, as a poisoned resolver or a
 * hostile corporate proxy would arrange) serves the cluster's public CAs, so the --ca-pin check passes. gwsh login
 * must refuse it before it sends the password (GW_ERR_TLS_WRONG_ROLE): the certificate does not carry the role
 * proxy. The same for a login with the CA kept from earlier, for gwctl on that profile, and for an agent's join
 * through it (no token).
 *
 * The cluster is an Auth Service in this process (SQLite in memory); the agent's certificate comes from a real
 * join. Needs dist/ (npm run build).
 */
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import https from 'node:https';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateKeyPair, identityFromCert } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { openSqliteBackend } from '../../src/backend/index.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { joinCluster } from '../../src/agent/identity.js';
import { saveProfile } from '../../src/client/profile.js';
import { Dialer } from '../../src/dial/dialer.js';
import { BIN, runCli } from '../helpers/gateway.js';

setRootLogger(createLogger({ level: 'silent' }));

let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
let home: string;
let rogue: https.Server;
let rogueAddr: string;
/** Every request the rogue server received: path and body. */
const received: Array<{ path: string; body: string }> = [];

beforeAll(async () => {
  if (!existsSync(BIN('gwsh'))) throw new Error('dist/ is missing: run npm run build first (the test runs the built gwsh)');
  backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'rogue.example' });
  const { token } = await auth.addToken(auth.adminIdentity(), { roles: ['node', 'app'] });
  const keys = generateKeyPair();
  // An agent that joined with the address the rogue will be reached at (loopback is nobody's, so the join passes).
  const agent = await auth.join({ token, roles: ['node', 'app'], nodename: 'node-7', publicAddrs: ['127.0.0.1'], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '10.0.0.9' });
  expect(identityFromCert(agent.tlsCert)).toMatchObject({ kind: 'host', roles: ['node', 'app'] });
  const cas = auth.publicCas();
  rogue = https.createServer({ cert: agent.tlsCert, key: keys.privateKeyPem }, (req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      received.push({ path: req.url ?? '', body });
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(req.url === '/webapi/ca' ? cas : {}));
    });
  });
  await new Promise<void>((resolve) => rogue.listen(0, '127.0.0.1', resolve));
  rogueAddr = `127.0.0.1:${(rogue.address() as net.AddressInfo).port}`;
  home = await mkdtemp(join(tmpdir(), 'gw-rogue-'));
});

afterAll(async () => {
  rogue?.closeAllConnections();
  rogue?.close();
  await backend?.close();
  if (home) await rm(home, { recursive: true, force: true });
});

describe("a rogue server with an agent's certificate, reached as the Proxy", () => {
  it('hostile: gwsh login --ca-pin gets past the pin (the CAs are public) but sends no password: GW_ERR_TLS_WRONG_ROLE', async () => {
    const login = await runCli('gwsh', ['login', `--proxy=${rogueAddr}`, '--user=alice', `--ca-pin=${auth.caPin()}`], { env: { GWSH_HOME: home }, input: 'correct horse battery\n' });
    expect(login.status).not.toBe(0);
    expect(login.stderr).toContain('GW_ERR_TLS_WRONG_ROLE');
    expect(login.stderr).toMatch(/roles node, app/);
    expect(received.map((r) => r.path)).toEqual(['/webapi/ca']); // the pin check only: nothing secret
    expect(received.some((r) => r.body.includes('correct horse battery'))).toBe(false);
  });

  it('hostile: a login that trusts the CA kept for that address, and gwctl on the profile, are refused the same way', async () => {
    received.length = 0;
    // A profile of an earlier login to this address (as gwsh writes it): the cluster's CA is kept and trusted.
    await auth.addUser(auth.adminIdentity(), 'alice', ['access'], 'correct horse battery');
    const user = generateKeyPair();
    const bundle = await auth.login({ username: 'alice', password: 'correct horse battery', publicKeyPem: user.publicKeyPem, sshPublicKey: user.sshPublicKey, source: '10.0.0.1' });
    saveProfile(home, rogueAddr, 'alice', user.privateKeyPem, bundle);
    const again = await runCli('gwsh', ['login', `--proxy=${rogueAddr}`, '--user=alice'], { env: { GWSH_HOME: home }, input: 'correct horse battery\n' });
    expect(again.stderr).toContain('GW_ERR_TLS_WRONG_ROLE');
    const ctl = await runCli('gwctl', ['get', 'nodes'], { env: { GWSH_HOME: home } });
    expect(ctl.stderr).toContain('GW_ERR_TLS_WRONG_ROLE');
    expect(received).toEqual([]);
  });

  it("hostile: an agent joining through it (--proxy, --ca-pin) sends no join token", async () => {
    received.length = 0;
    const secret = 'f00dfeedf00dfeedf00dfeedf00dfeed';
    const err = await joinCluster({ dataDir: join(home, 'agent'), server: rogueAddr, token: secret, caPin: auth.caPin(), roles: ['db'], nodename: 'db-1', publicAddrs: [], dialer: new Dialer({ env: {} }), joinedVia: 'proxy' }).then(() => undefined, (e: unknown) => e);
    expect(err).toMatchObject({ code: 'GW_ERR_TLS_WRONG_ROLE' });
    expect(received.map((r) => r.path)).toEqual(['/webapi/ca']);
    expect(received.some((r) => r.body.includes(secret))).toBe(false);
  });
});
