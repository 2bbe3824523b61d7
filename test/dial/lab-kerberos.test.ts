/**
 * The Kerberos proxy lab (test/helpers/kerberos.ts) proven with curl as the reference client: a real MIT KDC, a
 * squid asking for Negotiate through negotiate_kerberos_auth, and `curl --proxy-negotiate -U :` with the user's
 * credential cache. When the gateway's Negotiate fails against this lab, the lab is known good.
 *
 * Then src/dial/negotiate.ts with the real GSSAPI binding (the `kerberos` npm package, an optional native module:
 * GW_TEST_KERBEROS_MODULE may name where it is built when it is not in node_modules; without it those tests are
 * skipped, saying so): its token in a hand-made CONNECT, which squid accepts and logs with the principal.
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadGssapi, negotiateScheme, type GssapiBinding } from '../../src/dial/negotiate.js';
import { connectWithScheme, getThroughTunnel } from '../helpers/connauth.js';
import { curl } from '../helpers/curl.js';
import { startKerberosLab, type KerberosLab } from '../helpers/kerberos.js';
import { parseAccessLogLine } from '../helpers/squid.js';

let lab: KerberosLab;
let web: http.Server;
let target: string;

beforeAll(async () => {
  lab = await startKerberosLab();
  web = http.createServer((_req, res) => res.end('behind the kerberos proxy\n'));
  await new Promise<void>((r) => web.listen(0, '127.0.0.3', r));
  target = `http://127.0.0.3:${(web.address() as AddressInfo).port}/`;
}, 60_000);

afterAll(async () => {
  web?.closeAllConnections();
  if (web) await new Promise((r) => web.close(r));
  await lab?.stop();
});

/**
 * A credential cache whose ticket has expired: a 3-second ticket, then wait until klist -s says it is no longer
 * valid, and 1.5 s more. Ticket times are whole seconds: in the second a ticket ends, the KDC (within its clock
 * skew) still issues a service ticket ending that same second, and squid accepts it; from the next second on
 * libkrb5 refuses the expired ticket itself ("Ticket expired"), which is the case tested here.
 */
async function expiredCache(): Promise<string> {
  const cache = await lab.kinit(lab.user.principal, lab.user.password, '3s');
  const deadline = Date.now() + 30_000;
  while ((await run('klist', ['-s'], { env: { ...lab.env, KRB5CCNAME: cache } })) === 0) {
    if (Date.now() > deadline) throw new Error('the 3-second ticket is still valid after 30 s');
    await new Promise((r) => setTimeout(r, 250));
  }
  await new Promise((r) => setTimeout(r, 1500));
  return cache;
}

/** A program's exit status. */
function run(cmd: string, args: string[], o: { env: Record<string, string> }): Promise<number | null> {
  return new Promise((resolve) => spawn(cmd, args, { env: { PATH: process.env.PATH ?? '', ...o.env }, stdio: 'ignore' }).once('exit', resolve));
}

/** curl through the lab's squid with a CONNECT tunnel (as the Dialer uses it), Negotiate from KRB5CCNAME. */
function curlNegotiate(env: Record<string, string>, extra: string[] = []) {
  return curl(['-p', '-x', lab.proxyUrl, '--resolve', lab.resolve, '--proxy-negotiate', '-U', ':', ...extra, target], env);
}

describe('the Kerberos proxy lab, with curl as the client', () => {
  it('lets a user with a ticket through, and squid logs the principal', async () => {
    const r = await curlNegotiate(lab.env);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('behind the kerberos proxy\n');
    const line = await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(lab.user.principal));
    expect(parseAccessLogLine(line)).toMatchObject({ method: 'CONNECT', status: 200, user: 'alice@GW.TEST' });
    // The ticket curl used was issued by the lab's KDC for the proxy's service principal.
    expect(await lab.kdcLog()).toContain(`TGS_REQ`);
    expect(await lab.kdcLog()).toContain(`for HTTP/${lab.proxyHost}@${lab.realm}`);
  });

  it('answers 407 to a client without a ticket (an empty credential cache)', async () => {
    const r = await curlNegotiate({ ...lab.env, KRB5CCNAME: `FILE:${lab.dir}/no-such-cache` }, ['-o', '/dev/null', '-w', '%{http_connect}']);
    expect(r.stdout).toBe('407');
    expect(r.status).not.toBe(0);
  });

  it('answers 407 to a client whose ticket has expired', async () => {
    const r = await curlNegotiate({ ...lab.env, KRB5CCNAME: await expiredCache() }, ['-o', '/dev/null', '-w', '%{http_connect}']);
    expect(r.stdout).toBe('407');
  });

  it('answers 407 to a ticket for another proxy name (a service principal squid has no key for)', async () => {
    await lab.kadmin('addprinc -randkey HTTP/other.gw.test');
    const other = `other.gw.test:${lab.squid.port}:${lab.squid.host}`;
    const r = await curl(
      ['-p', '-x', `http://other.gw.test:${lab.squid.port}`, '--resolve', other, '--proxy-negotiate', '-U', ':', '-o', '/dev/null', '-w', '%{http_connect}', target],
      lab.env,
    );
    expect(r.stdout).toBe('407');
  });
});

let binding: GssapiBinding | undefined;
try {
  binding = loadGssapi(process.env.GW_TEST_KERBEROS_MODULE ?? 'kerberos');
} catch {
  binding = undefined;
}

describe.skipIf(!binding)('src/dial/negotiate.ts against the lab (skipped when the kerberos npm package is not installed: see docs/dialing.md)', () => {
  const saved = { ...process.env };
  /** GSSAPI reads the process's environment: point it at the lab's realm and the given credentials. */
  const useEnv = (env: Record<string, string>) => {
    for (const k of ['KRB5_CONFIG', 'KRB5CCNAME', 'KRB5_CLIENT_KTNAME']) delete process.env[k];
    Object.assign(process.env, env);
  };
  afterAll(() => useEnv({ ...(saved.KRB5_CONFIG ? { KRB5_CONFIG: saved.KRB5_CONFIG } : {}), ...(saved.KRB5CCNAME ? { KRB5CCNAME: saved.KRB5CCNAME } : {}) }));
  const hostPort = () => target.slice('http://'.length, -1);

  it('makes a token for HTTP@proxy.gw.test from the user\'s credential cache; squid lets the CONNECT through', async () => {
    useEnv(lab.env);
    const r = await connectWithScheme(lab.squid, hostPort(), negotiateScheme(lab.proxyHost, binding));
    expect(r.error).toBeUndefined();
    expect(r.statuses).toEqual([200]);
    expect(r.sent[0]).toMatch(/^Negotiate YII/); // a SPNEGO initial context token (ASN.1 [APPLICATION 0])
    expect(await getThroughTunnel(r.tunnel!, hostPort())).toContain('behind the kerberos proxy');
    const line = await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(` 200 ${lab.user.principal} `));
    expect(parseAccessLogLine(line).user).toBe('alice@GW.TEST');
  });

  it('gets its own tickets from a client keytab (KRB5_CLIENT_KTNAME), as an agent running as a service does', async () => {
    await lab.kadmin('addprinc -randkey agent1');
    await lab.kadmin(`ktadd -k ${lab.dir}/agent1.keytab agent1`);
    useEnv({ KRB5_CONFIG: lab.env.KRB5_CONFIG!, KRB5_CLIENT_KTNAME: `${lab.dir}/agent1.keytab`, KRB5CCNAME: `FILE:${lab.dir}/agent1-cache` });
    const r = await connectWithScheme(lab.squid, hostPort(), negotiateScheme(lab.proxyHost, binding));
    expect(r.statuses).toEqual([200]);
    r.tunnel!.destroy();
    await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(` agent1@${lab.realm} `));
  });

  it('without credentials: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED before anything is sent', async () => {
    useEnv({ KRB5_CONFIG: lab.env.KRB5_CONFIG!, KRB5CCNAME: `FILE:${lab.dir}/empty-cache` });
    const r = await connectWithScheme(lab.squid, hostPort(), negotiateScheme(lab.proxyHost, binding));
    expect(r.sent).toEqual([]);
    expect(r.error).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
  });

  it('with an expired ticket: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED saying so, before anything is sent', async () => {
    useEnv({ ...lab.env, KRB5CCNAME: await expiredCache() });
    const r = await connectWithScheme(lab.squid, hostPort(), negotiateScheme(lab.proxyHost, binding));
    expect(r.sent).toEqual([]);
    expect(r.error).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
    expect(String(r.error)).toMatch(/expired/i);
  });

  it('for a proxy name the realm does not know: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED naming the principal', async () => {
    useEnv(lab.env);
    const r = await connectWithScheme(lab.squid, hostPort(), negotiateScheme('unknown.gw.test', binding));
    expect(r.error).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
    expect(String(r.error)).toContain('HTTP@unknown.gw.test');
  });

  it('a ticket for another service principal is refused by squid: the scheme stops at the bare Negotiate', async () => {
    useEnv(lab.env);
    await lab.kadmin('addprinc -randkey HTTP/elsewhere.gw.test').catch(() => undefined);
    const r = await connectWithScheme(lab.squid, hostPort(), negotiateScheme('elsewhere.gw.test', binding));
    expect(r.statuses).toEqual([407]);
    expect(r.error).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_AUTH_REFUSED' });
  });

  it("a lying proxy's continuation token is refused by GSSAPI: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED, nothing more sent", async () => {
    useEnv(lab.env);
    const scheme = negotiateScheme(lab.proxyHost, binding);
    await scheme.first();
    for (const token of ['oRQwEqADCgEBoQsGCSqGSIb3EgECAg==', Buffer.alloc(64, 0x41).toString('base64')]) {
      const err = await scheme.next(`Negotiate ${token}`).then(() => undefined, (e: unknown) => e);
      expect(err).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
    }
  });
});
