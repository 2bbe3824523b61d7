/**
 * Names of the cluster's own members are not for agents (src/auth/reserved.ts, joining.ts): issue 23 saw a node
 * join with public_addrs naming the Proxy get a host certificate with the Proxy's name. The Auth Service refuses
 * (GW_ERR_AUTH_JOIN_NAME_RESERVED) a node name or public address that is a Proxy's or the Auth Service's, as
 * configured here and as live Proxy records announce them, the cluster name, a name under a Proxy's public name
 * (apps), or a wildcard covering one; the token is not used by a refusal. A Proxy's own join may name them.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { X509Certificate } from 'node:crypto';
import { generateKeyPair, identityFromCert, parseSshCert } from '../../src/auth/pki.js';
import { canonicalName, memberNames, reservedBy } from '../../src/auth/reserved.js';
import { AuthService, type JoinRole } from '../../src/auth/service.js';
import { openSqliteBackend } from '../../src/backend/index.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { codeOf } from '../helpers/errors.js';

setRootLogger(createLogger({ level: 'silent' }));

let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
const keys = generateKeyPair();

beforeEach(async () => {
  backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
  auth = await AuthService.open({
    backend,
    clusterName: 'unit.example',
    memberNames: [
      { name: 'gw-1', owner: 'the node name of this Auth Service and Proxy' },
      { name: 'auth.unit.example', owner: 'a public address of the Auth Service' },
      { name: 'proxy.unit.example', owner: 'a public address of the Proxy', under: true },
      { name: 'localhost', owner: 'loopback: never reserved' },
    ],
  });
  // A Proxy in its own process, as its heartbeat announces it.
  const now = new Date().toISOString();
  await auth.heartbeatProxy({ id: 'p-2', nodename: 'proxy-b', version: '1', public_addr: 'edge.example.net:443', public_addrs: ['edge.example.net:443', '[2001:db8::7]:443'], peer_addr: '10.9.9.9:3021', channels_digest: 'x', channels: {}, started_at: now, last_heartbeat: now }, 60_000);
});

afterEach(async () => {
  await backend.close();
});

const join = (token: string, nodename: string, publicAddrs: string[], roles: JoinRole[] = ['node']) =>
  auth.join({ token, roles, nodename, publicAddrs, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '10.0.0.9' });


describe('joins that name a cluster member', () => {
  it('hostile: a node join asking for the Proxy\'s public name, a name under it, a wildcard over it, or any other member name is refused, and the token stays usable', async () => {
    const { token } = await auth.addToken(auth.adminIdentity(), { roles: ['node', 'db', 'app'], uses: 1 });
    const refused: Array<[string, string[]]> = [
      ['node-1', ['proxy.unit.example:3022']], // the attack: the Proxy's public name
      ['node-1', ['PROXY.unit.example.']], // the same name, spelled otherwise
      ['node-1', ['grafana.proxy.unit.example']], // an app's name under the Proxy's
      ['node-1', ['*.unit.example']], // a wildcard that covers the Proxy's name
      ['node-1', ['auth.unit.example']], // the Auth Service's public address
      ['node-1', ['unit.example']], // the cluster name
      ['gw-1', []], // the node name of this Auth Service / Proxy
      ['proxy-b', []], // a Proxy's node name, from its record
      ['node-1', ['edge.example.net:443']], // a Proxy's public address, from its record
      ['node-1', ['a.b.edge.example.net']], // under it
      ['node-1', ['2001:db8:0::7']], // its second public address, an IPv6 address written otherwise
      ['node-1', ['10.9.9.9:3022']], // its peering address
      ['proxy.unit.example', []], // a node name is a name of the certificate too
    ];
    for (const [nodename, addrs] of refused) {
      expect([nodename, addrs, await codeOf(join(token, nodename, addrs))]).toEqual([nodename, addrs, 'GW_ERR_AUTH_JOIN_NAME_RESERVED']);
    }
    // Nothing was consumed by the refusals, and the agent's own names are fine (loopback is nobody's).
    const joined = await join(token, 'node-1', ['node-1.example.com:3022', 'other.unit.example', 'localhost', '127.0.0.1']);
    expect(identityFromCert(joined.tlsCert)).toMatchObject({ kind: 'host', roles: ['node'] });
  });

  it("the refusal names the reserved name and whose it is, with a hint; it is not counted as a failed token", async () => {
    const { token } = await auth.addToken(auth.adminIdentity(), { roles: ['node'], uses: 0 });
    const err = (await join(token, 'node-1', ['app.edge.example.net']).then(() => undefined, (e: unknown) => e)) as GatewayError;
    expect(err).toMatchObject({ code: 'GW_ERR_AUTH_JOIN_NAME_RESERVED' });
    expect(err.message).toContain('"app.edge.example.net"');
    expect(err.message).toContain('Proxy p-2 (proxy-b)');
    expect(err.hint).toMatch(/name of its own/);
    // Ten refusals would rate-limit a source if they counted as token failures; they do not.
    for (let i = 0; i < 12; i++) expect(await codeOf(join(token, 'node-1', ['proxy.unit.example']))).toBe('GW_ERR_AUTH_JOIN_NAME_RESERVED');
    await expect(join(token, 'node-2', [])).resolves.toBeDefined();
  });

  it("a Proxy's own join (token type proxy) may name the Proxies' public name: Proxies behind one balancer share it", async () => {
    const { token } = await auth.addToken(auth.adminIdentity(), { roles: ['proxy'] });
    const joined = await join(token, 'proxy-c', ['proxy.unit.example:443'], ['proxy']);
    expect(identityFromCert(joined.tlsCert).roles).toEqual(['proxy']);
  });

  it('a role comes only from a token of its type: a node token cannot yield proxy (auth is no join type at all)', async () => {
    const { token } = await auth.addToken(auth.adminIdentity(), { roles: ['node', 'db', 'app', 'kube', 'desktop'] });
    expect(await codeOf(join(token, 'node-1', [], ['node', 'proxy']))).toBe('GW_ERR_AUTH_TOKEN_WRONG_TYPE');
    expect(await codeOf(join(token, 'node-1', [], ['auth' as JoinRole]))).toBe('GW_ERR_AUTH_TOKEN_WRONG_TYPE');
  });
});

describe('renewal of a host that joined before names were reserved', () => {
  it("hostile: its renewed certificates leave out the member names its record holds; the record is kept as it is", async () => {
    const { token } = await auth.addToken(auth.adminIdentity(), { roles: ['node'] });
    const joined = await join(token, 'node-9', ['node-9.example.com:3022']);
    // As an old join left it: the Proxy's public name among its addresses, a Proxy's node name as its own.
    const key = `/nodes/${joined.hostId}`;
    const stored = JSON.parse((await backend.get(key))!.value) as Record<string, unknown>;
    const old = { ...stored, nodename: 'proxy-b', publicAddrs: ['node-9.example.com:3022', 'proxy.unit.example:3022'] };
    await backend.put(key, JSON.stringify(old));
    const renewed = await auth.renewHost({ hostId: joined.hostId, publicKeyPem: keys.publicKeyPem, via: 'direct' });
    const names = new X509Certificate(renewed.tlsCert).subjectAltName ?? '';
    expect(names).toContain('DNS:node-9.example.com');
    expect(names).toContain(`DNS:${joined.hostId}`);
    expect(names).not.toContain('proxy.unit.example');
    expect(names).not.toContain('proxy-b');
    expect(parseSshCert(renewed.sshCert).principals).not.toContain('proxy.unit.example');
    const after = JSON.parse((await backend.get(key))!.value) as Record<string, unknown>;
    expect([after.nodename, after.publicAddrs]).toEqual(['proxy-b', old.publicAddrs]);
  });
});

describe('reservedBy (pure)', () => {
  const members = memberNames([
    { name: 'Proxy.Example.com.', owner: 'p', under: true },
    { name: '10.0.0.1', owner: 'ip', under: true },
    { name: '127.0.0.1', owner: 'loopback' },
    { name: '0.0.0.0', owner: 'any' },
  ]);

  it('keeps canonical, reservable names only; an IP address has nothing under it', () => {
    expect(members).toEqual([{ name: 'proxy.example.com', owner: 'p', under: true }, { name: '10.0.0.1', owner: 'ip' }]);
    expect(canonicalName('[2001:DB8:0:0::1]')).toBe('2001:db8::1');
  });

  it('matches the name, names under it, and wildcards over it; not neighbours', () => {
    expect(reservedBy('proxy.example.com', members)?.owner).toBe('p');
    expect(reservedBy('x.y.proxy.example.com', members)?.owner).toBe('p');
    expect(reservedBy('*.example.com', members)?.owner).toBe('p');
    expect(reservedBy('*.proxy.example.com', members)?.owner).toBe('p');
    expect(reservedBy('10.0.0.1', members)?.owner).toBe('ip');
    for (const free of ['example.com', 'otherproxy.example.com', 'proxy.example.com.evil', '*.other.com', '10.0.0.10', 'x.10.0.0.1', '127.0.0.1']) {
      expect([free, reservedBy(free, members)]).toEqual([free, undefined]);
    }
  });
});
