/**
 * The Kerberos proxy lab (test/helpers/kerberos.ts) proven with curl as the reference client: a real MIT KDC, a
 * squid asking for Negotiate through negotiate_kerberos_auth, and `curl --proxy-negotiate -U :` with the user's
 * credential cache. When the gateway's Negotiate fails against this lab, the lab is known good.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
  if (web) await new Promise((r) => web.close(r));
  await lab?.stop();
});

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
