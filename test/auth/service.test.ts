/** The Auth Service's rules, with a real SQLite backend (in memory) and an injected clock. */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openSqliteBackend } from '../../src/backend/index.js';
import { generateKeyPair, identityFromCert, parseSshCert, signRenewProof, verifyCert, type Identity, type RenewProof } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { parseManifest } from '../../src/auth/resources/index.js';
import { GatewayError } from '../../src/errors.js';
import { codeOf } from '../helpers/errors.js';

let now = Date.parse('2026-11-21T10:00:00Z');
const clock = () => now;
let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
let admin: Identity;
const keys = generateKeyPair();


const login = (username: string, password: string, source = '10.0.0.1') =>
  auth.login({ username, password, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source });

const join = (token: string, roles: Array<'node' | 'db'> = ['node'], nodename = 'node-1') =>
  auth.join({ token, roles, nodename, publicAddrs: ['node-1.example.com:3022', '10.1.2.3'], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '10.0.0.9' });

beforeEach(async () => {
  now = Date.parse('2026-11-21T10:00:00Z');
  backend = openSqliteBackend({ path: ':memory:', clock, sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'unit.example', clock });
  admin = auth.adminIdentity();
  await auth.addUser(admin, 'alice', ['access'], 'correct horse battery');
});

afterEach(async () => {
  await backend.close();
});

describe('cluster identity', () => {
  it('keeps the same cluster and CAs when opened again, and refuses a rename', async () => {
    const again = await AuthService.open({ backend, clusterName: 'unit.example', clock });
    expect(again.caPin()).toBe(auth.caPin());
    expect(again.user.tls.certPem).toBe(auth.user.tls.certPem);
    expect(await codeOf(AuthService.open({ backend, clusterName: 'renamed.example', clock }))).toBe('GW_ERR_AUTH_CLUSTER_NAME');
  });
});

describe('login', () => {
  it('issues user certificates with the roles, the cluster and a 12 h lifetime by default', async () => {
    const bundle = await login('alice', 'correct horse battery');
    const id = identityFromCert(bundle.tlsCert);
    expect(id).toMatchObject({ kind: 'user', name: 'alice', cluster: 'unit.example', roles: ['access'] });
    expect(Date.parse(bundle.validUntil) - now).toBe(12 * 3600_000);
    expect(await verifyCert(bundle.tlsCert, auth.user.tls.certPem, now)).toBeUndefined();
    expect(parseSshCert(bundle.sshCert, auth.user.ssh.publicKey)).toMatchObject({ certType: 'user', keyId: 'alice', signedByCa: true });
  });

  it('gives the same error for a wrong password and an unknown user', async () => {
    expect(await codeOf(login('alice', 'wrong password'))).toBe('GW_ERR_AUTH_LOGIN_FAILED');
    expect(await codeOf(login('mallory', 'wrong password'))).toBe('GW_ERR_AUTH_LOGIN_FAILED');
  });

  it('rate limits wrong passwords per user and source, then lets them in again after the window', async () => {
    for (let i = 0; i < 5; i++) expect(await codeOf(login('alice', `wrong ${i}`))).toBe('GW_ERR_AUTH_LOGIN_FAILED');
    // Even the right password waits now, from that source...
    expect(await codeOf(login('alice', 'correct horse battery'))).toBe('GW_ERR_AUTH_RATE_LIMITED');
    // ...but another source is not punished for it.
    await expect(login('alice', 'correct horse battery', '10.0.0.2')).resolves.toBeDefined();
    now += 5 * 60_000 + 1;
    await expect(login('alice', 'correct horse battery')).resolves.toBeDefined();
  });

  it('a role change reaches certificates only at the next login', async () => {
    const before = identityFromCert((await login('alice', 'correct horse battery')).tlsCert);
    await auth.setUserRoles(admin, 'alice', ['access', 'editor']);
    expect(before.roles).toEqual(['access']);
    expect(identityFromCert((await login('alice', 'correct horse battery')).tlsCert).roles).toEqual(['access', 'editor']);
  });
});

describe('access control', () => {
  const alice = (): Identity => ({ kind: 'user', name: 'alice', cluster: 'unit.example', roles: ['access'] });
  const maintenance = parseManifest('kind: cluster_maintenance_config\nspec:\n  agent_upgrades:\n    utc_start_hour: 3\n    weekdays: ["*"]\n', 'm.yaml');

  it('no preset role may manage cluster_maintenance_config, not even editor', async () => {
    for (const roles of [['access'], ['editor'], ['auditor'], ['access', 'editor', 'auditor']]) {
      const who: Identity = { ...alice(), roles };
      expect(await codeOf(auth.createResources(who, maintenance, false))).toBe('GW_ERR_ACCESS_DENIED');
    }
  });

  it('a role with the seed\'s rule may, and a deny rule wins over it', async () => {
    const roles = parseManifest(
      [
        'kind: role\nversion: v7\nmetadata: {name: maint}\nspec:\n  allow:\n    rules: [{resources: [cluster_maintenance_config], verbs: [create, read, update, delete]}]',
        'kind: role\nversion: v7\nmetadata: {name: no-maint}\nspec:\n  deny:\n    rules: [{resources: [cluster_maintenance_config], verbs: ["*"]}]',
      ].join('\n---\n'),
      'roles.yaml',
    );
    await auth.createResources(admin, roles, false);
    // Only roles the stored user still has count: alice holds both, each certificate names some.
    await auth.setUserRoles(admin, 'alice', ['access', 'maint', 'no-maint']);
    expect(await auth.createResources({ ...alice(), roles: ['maint'] }, maintenance, false)).toEqual(['maintenance window has been updated']);
    expect(await codeOf(auth.createResources({ ...alice(), roles: ['maint', 'no-maint'] }, maintenance, true))).toBe('GW_ERR_ACCESS_DENIED');
  });

  it('identities of another cluster and host identities are refused', async () => {
    expect(await codeOf(auth.listUsers({ ...alice(), cluster: 'other.example', roles: ['editor'] }))).toBe('GW_ERR_ACCESS_DENIED');
    expect(await codeOf(auth.listUsers({ kind: 'host', name: 'h', cluster: 'unit.example', roles: ['node'] }))).toBe('GW_ERR_ACCESS_DENIED');
  });

  it('a manifest is all or nothing', async () => {
    const two = parseManifest('kind: role\nversion: v7\nmetadata: {name: r1}\nspec: {}\n---\nkind: role\nversion: v7\nmetadata: {name: r2}\nspec: {}\n', 'two.yaml');
    await auth.createResources(admin, [two[1]!], false);
    expect(await codeOf(auth.createResources(admin, two, false))).toBe('GW_ERR_RESOURCE_EXISTS');
    const names = (await auth.getResources(admin, 'role', undefined, false)).map((r) => r.metadata.name);
    expect(names).not.toContain('r1');
  });

  it('connector private keys come back only with secrets asked for', async () => {
    const key = '-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----';
    const cert = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----';
    const saml = parseManifest(
      `kind: saml\nversion: v2\nmetadata: {name: okta}\nspec:\n  acs: https://proxy.example.com/v1/webapi/saml/acs\n  entity_descriptor_url: https://idp.example.com/metadata\n  attributes_to_roles: [{name: groups, value: admins, roles: [editor]}]\n  signing_key_pair:\n    cert: |\n${cert.split('\n').map((l) => `      ${l}`).join('\n')}\n    private_key: |\n${key.split('\n').map((l) => `      ${l}`).join('\n')}\n`,
      'saml.yaml',
    );
    await auth.createResources(admin, saml, false);
    expect(JSON.stringify(await auth.getResources(admin, 'saml', 'okta', false))).not.toContain('PRIVATE KEY');
    expect(JSON.stringify(await auth.getResources(admin, 'saml', 'okta', true))).toContain('PRIVATE KEY');
  });
});

describe('join tokens', () => {
  it('a node token gives host certificates with the host id, node name and public addresses', async () => {
    const { token } = await auth.addToken(admin, { roles: ['node'] });
    const bundle = await join(token);
    const id = identityFromCert(bundle.tlsCert);
    expect(id).toMatchObject({ kind: 'host', name: bundle.hostId, roles: ['node'], nodename: 'node-1' });
    const ssh = parseSshCert(bundle.sshCert, auth.host.ssh.publicKey);
    expect(ssh.certType).toBe('host');
    expect(ssh.principals).toEqual(expect.arrayContaining([bundle.hostId, 'node-1', 'node-1.example.com', '10.1.2.3']));
  });

  it('is single use by default; --uses allows more; 0 means until it expires', async () => {
    const once = await auth.addToken(admin, { roles: ['node'] });
    await join(once.token);
    expect(await codeOf(join(once.token))).toBe('GW_ERR_AUTH_TOKEN_USED');
    const many = await auth.addToken(admin, { roles: ['node'], uses: 0 });
    for (let i = 0; i < 3; i++) await join(many.token, ['node'], `n${i}`);
  });

  it('two agents racing for the last use: exactly one wins', async () => {
    const { token } = await auth.addToken(admin, { roles: ['node'], uses: 1 });
    const results = await Promise.allSettled([join(token, ['node'], 'a'), join(token, ['node'], 'b'), join(token, ['node'], 'c')]);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
  });

  it('expired, unknown and wrong-type tokens each get their own error', async () => {
    const { token } = await auth.addToken(admin, { roles: ['node'], ttlMs: 60_000 });
    expect(await codeOf(join(token, ['db']))).toBe('GW_ERR_AUTH_TOKEN_WRONG_TYPE');
    now += 60_001;
    expect(await codeOf(join(token))).toBe('GW_ERR_AUTH_TOKEN_EXPIRED');
    expect(await codeOf(join('0'.repeat(32)))).toBe('GW_ERR_AUTH_TOKEN_UNKNOWN');
  });

  it('stores no token value: listing shows short ids, and a token can be removed by either', async () => {
    const a = await auth.addToken(admin, { roles: ['node'] });
    const b = await auth.addToken(admin, { roles: ['db'] });
    const listed = await auth.listTokens(admin);
    expect(JSON.stringify(listed)).not.toContain(a.token);
    await auth.removeToken(admin, a.token);
    await auth.removeToken(admin, b.id);
    expect(await auth.listTokens(admin)).toHaveLength(0);
    const all = await backend.range('/');
    expect(JSON.stringify(all)).not.toContain(a.token);
  });
});

describe('hardening: atomic rate limits', () => {
  it('200 parallel wrong logins: at most the limit is checked, the rest get 429, the right password in the burst too', async () => {
    const attempts = Array.from({ length: 200 }, (_, i) => codeOf(login('alice', i === 100 ? 'correct horse battery' : `wrong ${i}`)));
    const codes = await Promise.all(attempts);
    const checked = codes.filter((c) => c === 'GW_ERR_AUTH_LOGIN_FAILED').length;
    expect(checked).toBeGreaterThan(0);
    expect(checked).toBeLessThanOrEqual(5);
    expect(codes.filter((c) => c === 'GW_ERR_AUTH_RATE_LIMITED')).toHaveLength(200 - checked);
    expect(codes[100]).toBe('GW_ERR_AUTH_RATE_LIMITED');
    // Every password check that failed is in the audit log: no more than the limit ran.
    const failures = (await backend.range('/events/')).filter((i) => i.value.includes('"user.login.failure"'));
    expect(failures.length).toBe(checked);
    // Still locked out a moment later; after the window the right password works again.
    now += 60_000;
    expect(await codeOf(login('alice', 'correct horse battery'))).toBe('GW_ERR_AUTH_RATE_LIMITED');
    now += 5 * 60_000;
    await expect(login('alice', 'correct horse battery')).resolves.toBeDefined();
  }, 120_000);

  it('200 parallel joins with wrong tokens from one source are limited; another source is not', async () => {
    const bad = (i: number, source = '10.0.0.66') =>
      codeOf(auth.join({ token: `wrong-${i}`, roles: ['node'], nodename: `n${i}`, publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source }));
    const codes = await Promise.all(Array.from({ length: 200 }, (_, i) => bad(i)));
    const tried = codes.filter((c) => c === 'GW_ERR_AUTH_TOKEN_UNKNOWN').length;
    expect(tried).toBeGreaterThan(0);
    expect(tried).toBeLessThanOrEqual(10);
    expect(codes.filter((c) => c === 'GW_ERR_AUTH_RATE_LIMITED')).toHaveLength(200 - tried);
    // A real token from the limited source waits too; from another source it works.
    const { token } = await auth.addToken(admin, { roles: ['node'], uses: 0 });
    const good = (source: string) => auth.join({ token, roles: ['node'], nodename: 'ok', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source });
    expect(await codeOf(good('10.0.0.66'))).toBe('GW_ERR_AUTH_RATE_LIMITED');
    await expect(good('10.0.0.67')).resolves.toBeDefined();
    now += 10 * 60_000 + 1;
    await expect(good('10.0.0.66')).resolves.toBeDefined();
  });
});

describe('hardening: a bad join request burns no token', () => {
  const request = (token: string, over: Partial<Parameters<AuthService['join']>[0]>) =>
    auth.join({ token, roles: ['node'], nodename: 'node-1', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '10.0.0.9', ...over });

  it('a malformed public key, SSH key or address is refused with its own code, and the single-use token still works', async () => {
    const { token } = await auth.addToken(admin, { roles: ['node'] });
    expect(await codeOf(request(token, { publicKeyPem: '-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n' }))).toBe('GW_ERR_API_BAD_KEY');
    expect(await codeOf(request(token, { sshPublicKey: 'ssh-ed25519 AAAAnot-base64!' }))).toBe('GW_ERR_API_BAD_KEY');
    expect(await codeOf(request(token, { publicAddrs: ['bad name with spaces'] }))).toBe('GW_ERR_API_BAD_REQUEST');
    const bundle = await request(token, {});
    expect(identityFromCert(bundle.tlsCert)).toMatchObject({ kind: 'host', name: bundle.hostId });
    expect(await codeOf(request(token, {}))).toBe('GW_ERR_AUTH_TOKEN_USED');
  });

  it('a bad request is not counted as a failed join of its source', async () => {
    const { token } = await auth.addToken(admin, { roles: ['node'] });
    for (let i = 0; i < 30; i++) expect(await codeOf(request(token, { publicKeyPem: 'junk' }))).toBe('GW_ERR_API_BAD_KEY');
    await expect(request(token, {})).resolves.toBeDefined();
  });
});

describe('hardening: a removed user keeps no power', () => {
  const bob = (): Identity => ({ kind: 'user', name: 'bob', cluster: 'unit.example', roles: ['editor'] });

  it("a removed user's certificate is refused at once: tokens, users, connector secrets", async () => {
    await auth.addUser(admin, 'bob', ['editor'], 'correct horse battery');
    await expect(auth.addToken(bob(), { roles: ['node'] })).resolves.toBeDefined();
    await auth.removeUser(admin, 'bob');
    expect(await codeOf(auth.addToken(bob(), { roles: ['node'] }))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
    expect(await codeOf(auth.addUser(bob(), 'mallory', ['editor'], 'correct horse battery'))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
    expect(await codeOf(auth.getResources(bob(), 'github', undefined, true))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
    expect(await codeOf(login('mallory', 'correct horse battery'))).toBe('GW_ERR_AUTH_LOGIN_FAILED');
  });

  it('roles taken away apply at once; roles given apply at the next login (certificate ∩ stored user)', async () => {
    await auth.addUser(admin, 'bob', ['editor'], 'correct horse battery');
    await auth.setUserRoles(admin, 'bob', ['access']);
    expect(await codeOf(auth.addToken(bob(), { roles: ['node'] }))).toBe('GW_ERR_ACCESS_DENIED');
    await auth.setUserRoles(admin, 'bob', ['access', 'editor']);
    const accessOnly: Identity = { ...bob(), roles: ['access'] };
    expect(await codeOf(auth.addToken(accessOnly, { roles: ['node'] }))).toBe('GW_ERR_ACCESS_DENIED');
  });
});

describe('host certificate renewal', () => {
  const renew = (hostId: string, publicKeyPem = keys.publicKeyPem, via = 'proxy-1') => auth.renewHost({ hostId, publicKeyPem, via });
  const joined = async () => join((await auth.addToken(admin, { roles: ['node'] })).token);

  it('renews for the key it joined with: the same host, roles and names, a fresh validity, and records when', async () => {
    const first = await joined();
    now += 250 * 24 * 3600_000;
    const renewed = await renew(first.hostId);
    const id = identityFromCert(renewed.tlsCert);
    expect(id).toMatchObject({ kind: 'host', name: first.hostId, roles: ['node'], nodename: 'node-1', cluster: 'unit.example' });
    expect(Date.parse(renewed.validUntil) - now).toBe(365 * 24 * 3600_000);
    expect(Date.parse(renewed.validUntil)).toBeGreaterThan(Date.parse(first.validUntil));
    expect(await verifyCert(renewed.tlsCert, auth.host.tls.certPem, now)).toBeUndefined();
    const ssh = parseSshCert(renewed.sshCert, auth.host.ssh.publicKey);
    expect(ssh).toMatchObject({ certType: 'host', keyId: first.hostId, signedByCa: true, publicKey: keys.sshPublicKey.trim().split(' ').slice(0, 2).join(' ') });
    expect(ssh.principals).toEqual(expect.arrayContaining([first.hostId, 'node-1', 'node-1.example.com', '10.1.2.3']));
    expect((await auth.getNode(first.hostId))?.renewedAt).toBe(new Date(now).toISOString());
    const events = await auth.listEvents(admin, 5);
    expect(events.map((e) => e.event).find((e) => e.event === 'host.renew')).toMatchObject({ host_id: first.hostId, via: 'proxy-1' });
  });

  it('hostile: another key is refused, and nothing is recorded', async () => {
    const first = await joined();
    const other = generateKeyPair();
    const e = await renew(first.hostId, other.publicKeyPem).catch((err: GatewayError) => err);
    expect(e).toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/not the one it joined with/) });
    expect((await auth.getNode(first.hostId))?.renewedAt).toBeUndefined();
    // For a minute after a refusal, asks of that host are too soon, looked into no further (no Backend read, no log).
    now += 59_000;
    expect(await renew(first.hostId).catch((err: GatewayError) => err)).toMatchObject({ code: 'GW_ERR_HOST_RENEW_TOO_SOON', message: expect.stringMatching(/refused a renewal through the same way less than 60 s ago/) });
    now += 1_000;
    expect(await codeOf(renew(first.hostId, 'not a key'))).toBe('GW_ERR_HOST_RENEW_REFUSED');
    now += 60_000;
    expect(identityFromCert((await renew(first.hostId)).tlsCert).name).toBe(first.hostId);
  });

  it("hostile: an ask a Proxy carries needs the host's fresh proof; a Proxy asking wrongly shuts out only its own asks", async () => {
    const first = await joined();
    const carried = (via: string, proof: RenewProof | undefined) => auth.renewHost({ hostId: first.hostId, publicKeyPem: keys.publicKeyPem, via, carried: { proof } });
    const refusal = (p: Promise<unknown>) => p.catch((err: GatewayError) => err);
    const proofAt = (at: number, key = keys.privateKeyPem) => signRenewProof(key, first.hostId, 'unit.example', keys.publicKeyPem, at);
    expect(await refusal(carried('p-evil', undefined))).toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/carries no proof/) });
    expect(await refusal(carried('p-2', proofAt(now, generateKeyPair().privateKeyPem)))).toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/not signed by the key the host joined with/) });
    expect(await refusal(carried('p-3', proofAt(now - 6 * 60_000)))).toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/more than 5 minutes from/) });
    expect(await refusal(carried('p-4', { ...proofAt(now), time: new Date(now + 1000).toISOString() }))).toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED' });
    // p-evil is shut out for a minute; the host's own ask through another Proxy is not.
    expect(await refusal(carried('p-evil', proofAt(now)))).toMatchObject({ code: 'GW_ERR_HOST_RENEW_TOO_SOON' });
    expect(identityFromCert((await carried('p-good', proofAt(now))).tlsCert).name).toBe(first.hostId);
  });

  it('hostile: a removed host, a host that never joined, and a locked host are refused as the API refuses them', async () => {
    const first = await joined();
    await auth.createLock(admin, { target: { node: first.hostId }, name: 'hold' });
    expect(await codeOf(renew(first.hostId))).toBe('GW_ERR_ACCESS_LOCKED');
    expect(await codeOf(renew('00000000-0000-4000-8000-000000000000'))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
    await backend.delete(`/nodes/${first.hostId}`);
    now += 60_000;
    expect(await codeOf(renew(first.hostId))).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
  });

  it('hostile: a second renewal within the hour is refused, and of two racing renewals exactly one is answered', async () => {
    const first = await joined();
    const results = await Promise.allSettled([renew(first.hostId), renew(first.hostId), renew(first.hostId)]);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect((r.reason as GatewayError).code).toBe('GW_ERR_HOST_RENEW_TOO_SOON');
    now += 3600_000 - 1;
    const e = await renew(first.hostId).catch((err: GatewayError) => err);
    expect(e).toMatchObject({ code: 'GW_ERR_HOST_RENEW_TOO_SOON', message: expect.stringMatching(/next renewal is possible from/) });
    now += 1;
    expect(identityFromCert((await renew(first.hostId)).tlsCert).name).toBe(first.hostId);
  });

  it('a node record from before keys were recorded cannot renew (it must join again)', async () => {
    const first = await joined();
    const record = (await auth.getNode(first.hostId))!;
    delete record.sshPublicKey;
    await backend.put(`/nodes/${first.hostId}`, JSON.stringify(record));
    expect(await renew(first.hostId).catch((err: GatewayError) => err)).toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/holds no key/) });
  });
});
