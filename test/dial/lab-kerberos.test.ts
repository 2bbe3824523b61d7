/**
 * The Kerberos proxy lab (test/helpers/kerberos.ts) proven with curl as the reference client: a real MIT KDC, a
 * squid asking for Negotiate through negotiate_kerberos_auth, and `curl --proxy-negotiate -U :` with the user's
 * credential cache. When the gateway's Negotiate fails against this lab, the lab is known good.
 *
 * Then the Dialer through the same squid, answering its 407 with Negotiate (src/dial/auth/negotiate.ts) and the
 * real GSSAPI binding (the `kerberos` npm package, an optional native module: GW_TEST_KERBEROS_MODULE may name
 * where it is built when it is not in node_modules; without it those tests are skipped, saying so): squid lets the
 * CONNECT through and logs the principal; no ticket, an expired one, a ticket for another service principal and
 * one from another realm each end the dial with a stable code.
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadGssapi, makeNegotiateScheme, type GssapiBinding } from '../../src/dial/auth/negotiate.js';
import { PROXY_AUTH_SCHEMES } from '../../src/dial/auth/scheme.js';
import { Dialer, dialRoute } from '../../src/dial/dialer.js';
import { dialError } from '../helpers/dial.js';
import { getThroughTunnel, labLookup, WEB_NAME, webHostsFile } from '../helpers/labdial.js';
import { curl } from '../helpers/curl.js';
import { startKerberosLab, type KerberosLab } from '../helpers/kerberos.js';
import { parseAccessLogLine } from '../helpers/squid.js';

let lab: KerberosLab;
let web: http.Server;
let target: string;
let webPort: number;

beforeAll(async () => {
  lab = await startKerberosLab({ squidConfig: [`hosts_file ${await webHostsFile()}`] });
  web = http.createServer((_req, res) => res.end('behind the kerberos proxy\n'));
  await new Promise<void>((r) => web.listen(0, '127.0.0.3', r));
  webPort = (web.address() as AddressInfo).port;
  target = `http://127.0.0.3:${webPort}/`;
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

describe.skipIf(!binding)('the Dialer answers the lab with Negotiate (skipped when the kerberos npm package is not installed: see docs/dialing.md)', () => {
  const saved = { ...process.env };
  /** GSSAPI reads the process's environment: point it at the lab's realm and the given credentials. */
  const useEnv = (env: Record<string, string>) => {
    for (const k of ['KRB5_CONFIG', 'KRB5CCNAME', 'KRB5_CLIENT_KTNAME']) delete process.env[k];
    Object.assign(process.env, env);
  };
  afterAll(() => useEnv({ ...(saved.KRB5_CONFIG ? { KRB5_CONFIG: saved.KRB5_CONFIG } : {}), ...(saved.KRB5CCNAME ? { KRB5CCNAME: saved.KRB5CCNAME } : {}) }));
  const webTarget = () => `${WEB_NAME}:${webPort}`;
  /** A Dialer through the lab's squid by its name (HTTP@proxy.gw.test), with the schemes of PROXY_AUTH_SCHEMES. */
  const dialer = (proxyUrl = lab.proxyUrl) =>
    new Dialer({
      env: { HTTPS_PROXY: proxyUrl },
      lookup: labLookup,
      connectTimeoutMs: 5_000,
      proxyAnswerTimeoutMs: 5_000,
      authSchemes: PROXY_AUTH_SCHEMES.map((s) => (s.name === 'Negotiate' ? makeNegotiateScheme({ binding }) : s)),
    });

  it("answers the 407 with a token for HTTP@proxy.gw.test from the user's credential cache; squid logs alice", async () => {
    useEnv(lab.env);
    const socket = await dialer().dial(webTarget());
    expect(dialRoute(socket)?.proxy?.auth).toBe('Negotiate'); // what dial-plan --probe prints
    expect(await getThroughTunnel(socket, webTarget())).toContain('behind the kerberos proxy');
    const line = await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(webTarget()) && l.includes(` 200 ${lab.user.principal} `));
    expect(parseAccessLogLine(line).user).toBe('alice@GW.TEST');
  });

  it('gets its own tickets from a client keytab (KRB5_CLIENT_KTNAME), as an agent running as a service does', async () => {
    await lab.kadmin('addprinc -randkey agent1');
    await lab.kadmin(`ktadd -k ${lab.dir}/agent1.keytab agent1`);
    useEnv({ KRB5_CONFIG: lab.env.KRB5_CONFIG!, KRB5_CLIENT_KTNAME: `${lab.dir}/agent1.keytab`, KRB5CCNAME: `FILE:${lab.dir}/agent1-cache` });
    (await dialer().dial(webTarget())).destroy();
    await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(` agent1@${lab.realm} `));
  });

  it('without credentials: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED, the hint naming kinit', async () => {
    useEnv({ KRB5_CONFIG: lab.env.KRB5_CONFIG!, KRB5CCNAME: `FILE:${lab.dir}/empty-cache` });
    const err = await dialError(dialer(), webTarget());
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    expect(err.message).toContain('run kinit');
    expect(err.hint).toContain('kinit');
  });

  it('with an expired ticket: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED saying so, no token sent', async () => {
    useEnv({ ...lab.env, KRB5CCNAME: await expiredCache() });
    const err = await dialError(dialer(), webTarget());
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    expect(err.message).toMatch(/expired/i);
  });

  it('for a proxy name the realm does not know: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED naming the principal', async () => {
    useEnv(lab.env);
    const err = await dialError(dialer(`http://unknown.gw.test:${lab.squid.port}`), webTarget());
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    expect(err.message).toContain('HTTP@unknown.gw.test');
  });

  it('a ticket for another service principal (the wrong keytab on the proxy) is refused: GW_ERR_DIAL_PROXY_AUTH_REFUSED, once', async () => {
    useEnv(lab.env);
    await lab.kadmin('addprinc -randkey HTTP/elsewhere.gw.test').catch(() => undefined);
    const err = await dialError(dialer(`http://elsewhere.gw.test:${lab.squid.port}`), webTarget());
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(err.message).toContain('Negotiate');
  });

  it('a ticket from another realm (a KDC the proxy does not trust): refused', async () => {
    const other = await startKerberosLab({ host: '127.0.0.4' });
    try {
      useEnv(other.env);
      const err = await dialError(dialer(), webTarget());
      expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    } finally {
      await other.stop();
    }
  });
});
