/**
 * A Kerberos proxy lab: Debian's MIT KDC with a realm of its own, and a squid that asks for Negotiate.
 *
 * Everything lives in one temp dir: krb5.conf (clients: curl, kinit, the gateway; given by KRB5_CONFIG) and
 * kdc.conf (the KDC and kadmin.local; KRB5_KDC_PROFILE), the KDC's database made by `kdb5_util create`, a user
 * principal with a password, the proxy's service principal HTTP/<proxy host> exported to a keytab, and the
 * credential caches `kinit` fills. The KDC (`krb5kdc -n`, in the foreground) listens on a free port of a loopback
 * address; no system file (/etc/krb5.conf, /etc/krb5.keytab) is read or written.
 *
 * The squid runs `negotiate_kerberos_auth -k <keytab> -s HTTP/<proxy host>@REALM` and logs the principal it
 * accepted as the user (`alice@GW.TEST`). The proxy host is a name (proxy.gw.test) that no resolver knows: a
 * client reaches it with curl's `--resolve` and asks for the ticket of `HTTP@proxy.gw.test`; krb5.conf turns off
 * DNS canonicalisation and reverse lookups so the name is used as written (as an operator's krb5.conf usually
 * does for proxies behind load balancers).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import getPort from 'get-port';
import { proxyUser, startSquid, type Squid } from './squid.js';
import { waitForPort } from './netns.js';

const run = promisify(execFile);
const KRB5KDC = '/usr/sbin/krb5kdc';
const NEGOTIATE_HELPER = '/usr/lib/squid/negotiate_kerberos_auth';

export const REALM = 'GW.TEST';
export const PROXY_HOST = 'proxy.gw.test';

export interface KerberosLab {
  realm: string;
  dir: string;
  /** The KDC's address. */
  kdc: { host: string; port: number };
  /** The proxy's name (its service principal is HTTP/<proxyHost>@REALM) and squid listening behind it. */
  proxyHost: string;
  squid: Squid;
  /** "http://proxy.gw.test:PORT": reach it with `--resolve proxy.gw.test:PORT:<squid.host>`. */
  proxyUrl: string;
  /** curl's `--resolve` entry for the proxy name. */
  resolve: string;
  user: { name: string; password: string; principal: string };
  /** The environment a Kerberos client of this realm needs: KRB5_CONFIG, and KRB5CCNAME of the user's cache. */
  env: Record<string, string>;
  /** kinit into a new credential cache; resolves to its KRB5CCNAME ("FILE:..."). */
  kinit(principal: string, password: string, lifetime?: string): Promise<string>;
  /** kadmin.local query (e.g. "addprinc -pw x bob"). */
  kadmin(query: string): Promise<string>;
  /** The KDC's log (which tickets it issued, and failures). */
  kdcLog(): Promise<string>;
  stop(): Promise<void>;
}

export interface KerberosLabOptions {
  /** Loopback address of the KDC and squid. Default 127.0.0.2. */
  host?: string;
  /** Extra squid.conf lines. */
  squidConfig?: string[];
  /** Addresses (CIDR) besides loopback that may use the squid (an agent in a network namespace). */
  clients?: string[];
}

function krb5Conf(dir: string, host: string, port: number): string {
  return `[libdefaults]
  default_realm = ${REALM}
  dns_lookup_kdc = false
  dns_lookup_realm = false
  dns_canonicalize_hostname = false
  rdns = false
  udp_preference_limit = 1
  default_ccache_name = FILE:${dir}/ccache-default
  default_keytab_name = FILE:${dir}/none.keytab
[realms]
  ${REALM} = {
    kdc = ${host}:${port}
  }
[domain_realm]
  .gw.test = ${REALM}
  gw.test = ${REALM}
`;
}

function kdcConf(dir: string, host: string, port: number): string {
  return `[kdcdefaults]
  kdc_listen = ${host}:${port}
  kdc_tcp_listen = ${host}:${port}
[realms]
  ${REALM} = {
    database_name = ${dir}/principal
    key_stash_file = ${dir}/stash
    acl_file = ${dir}/kadm5.acl
    max_life = 1h
    max_renewable_life = 0
    supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal
  }
[logging]
  kdc = FILE:${dir}/kdc.log
`;
}

/** Negotiate on squid: the Kerberos helper with the lab's keytab, and a 407 for anyone it does not accept. */
export function negotiateSquidConfig(keytab: string, proxyHost: string): string[] {
  return [
    `auth_param negotiate program ${NEGOTIATE_HELPER} -k ${keytab} -s HTTP/${proxyHost}@${REALM}`,
    'auth_param negotiate children 2 startup=1 idle=1',
    'auth_param negotiate keep_alive on',
    'acl kerberos_user proxy_auth REQUIRED',
    'http_access deny !kerberos_user',
  ];
}

/** Daemons still running when the test process exits are SIGKILLed (as squid.ts does for squid). */
const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

async function startKdc(env: NodeJS.ProcessEnv, host: string, port: number, log: string): Promise<ChildProcess> {
  const child = spawn(KRB5KDC, ['-n', '-r', REALM], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  running.add(child);
  child.once('exit', () => running.delete(child));
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  // krb5kdc writes why it stopped to its log file, not to stderr: the error carries both.
  const exited = new Promise<never>((_, reject) =>
    child.once('exit', (code) => {
      const logged = existsSync(log) ? readFileSync(log, 'utf8').slice(-2000) : '(no log file)';
      reject(new Error(`krb5kdc exited (${code}) during startup on ${host}:${port}: ${stderr}\nkdc.log: ${logged}`));
    }),
  );
  await Promise.race([waitForPort(host, port, 15_000), exited]);
  return child;
}

/**
 * The KDC on a free port: get-port's port can be taken by another test's listener before krb5kdc binds it, so a
 * KDC that exits during startup is tried again on another port (its configuration files rewritten), three times.
 */
async function startKdcOnFreePort(env: NodeJS.ProcessEnv, dir: string, host: string, files: { krb5: string; kdcProfile: string }): Promise<{ child: ChildProcess; port: number }> {
  for (let attempt = 1; ; attempt++) {
    const port = await getPort({ host });
    await writeFile(files.krb5, krb5Conf(dir, host, port));
    await writeFile(files.kdcProfile, kdcConf(dir, host, port));
    try {
      return { child: await startKdc(env, host, port, join(dir, 'kdc.log')), port };
    } catch (err) {
      if (attempt >= 3) throw err;
      console.error(`kerberos lab: ${(err as Error).message}; trying another port`);
    }
  }
}

export async function startKerberosLab(o: KerberosLabOptions = {}): Promise<KerberosLab> {
  const host = o.host ?? '127.0.0.2';
  const dir = await mkdtemp(join(tmpdir(), 'gw-krb-'));
  const krb5 = join(dir, 'krb5.conf');
  const kdcProfile = join(dir, 'kdc.conf');
  // The database is made before the KDC has a port: a placeholder until startKdcOnFreePort writes the real one.
  await writeFile(krb5, krb5Conf(dir, host, 88));
  await writeFile(kdcProfile, kdcConf(dir, host, 88));
  await writeFile(join(dir, 'kadm5.acl'), '');
  // The replay cache off: the helper's default (/var/tmp) is shared by every squid on the machine.
  const base = { PATH: process.env.PATH ?? '', KRB5_CONFIG: krb5, KRB5_KDC_PROFILE: kdcProfile, KRB5RCACHETYPE: 'none' };
  const steps: Array<() => Promise<unknown>> = [() => rm(dir, { recursive: true, force: true })];
  const stop = async () => {
    for (const step of steps.splice(0).reverse()) await step().catch((err) => console.error('kerberos lab stop:', err));
  };
  try {
    await run('kdb5_util', ['create', '-s', '-r', REALM, '-P', 'master-Pw-1'], { env: base });
    const kadmin = async (query: string) => (await run('kadmin.local', ['-r', REALM, '-q', query], { env: base })).stdout;
    const user = { name: 'alice', password: 'Al1ce-krb-pw', principal: `alice@${REALM}` };
    await kadmin(`addprinc -pw ${user.password} ${user.name}`);
    await kadmin(`addprinc -randkey HTTP/${PROXY_HOST}`);
    const keytab = join(dir, 'squid.keytab');
    await kadmin(`ktadd -k ${keytab} HTTP/${PROXY_HOST}`);
    const { child: kdcChild, port } = await startKdcOnFreePort(base, dir, host, { krb5, kdcProfile });
    steps.push(async () => {
      kdcChild.kill('SIGTERM');
      if (kdcChild.exitCode === null) await new Promise((r) => kdcChild.once('exit', r));
    });
    // squid's helpers run as squid's user: let them into the dir and read the keytab (and nothing else here).
    const owner = proxyUser();
    await chmod(dir, 0o755);
    if (owner) await chown(keytab, owner.uid, owner.gid);
    const squid = await startSquid({ host, env: base, ...(o.clients ? { clients: o.clients } : {}), extraConfig: [...negotiateSquidConfig(keytab, PROXY_HOST), ...(o.squidConfig ?? [])] });
    steps.push(() => squid.stop());
    let caches = 0;
    const kinit = async (principal: string, password: string, lifetime = '10m') => {
      const cache = `FILE:${dir}/ccache-${++caches}`;
      await new Promise<void>((resolve, reject) => {
        const child = spawn('kinit', ['-l', lifetime, principal], { env: { ...base, KRB5CCNAME: cache }, stdio: ['pipe', 'pipe', 'pipe'] });
        let out = '';
        child.stdout.on('data', (d: Buffer) => (out += d.toString()));
        child.stderr.on('data', (d: Buffer) => (out += d.toString()));
        child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`kinit ${principal} failed (${code}): ${out}`))));
        child.stdin.end(`${password}\n`);
      });
      return cache;
    };
    const ccache = await kinit(user.principal, user.password);
    return {
      realm: REALM,
      dir,
      kdc: { host, port },
      proxyHost: PROXY_HOST,
      squid,
      proxyUrl: `http://${PROXY_HOST}:${squid.port}`,
      resolve: `${PROXY_HOST}:${squid.port}:${squid.host}`,
      user,
      env: { KRB5_CONFIG: krb5, KRB5CCNAME: ccache },
      kinit,
      kadmin,
      kdcLog: async () => (existsSync(join(dir, 'kdc.log')) ? readFile(join(dir, 'kdc.log'), 'utf8') : ''),
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
