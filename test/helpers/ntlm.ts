/**
 * An NTLM proxy lab: a squid whose NTLM helper is Samba's `ntlm_auth --helper-protocol=squid-2.5-ntlmssp`, with
 * Samba's winbindd checking the answers against a local account database (a standalone server's tdbsam, the
 * domain being the server's NetBIOS name, GWLAB). Samba's default `ntlm auth = ntlmv2-only` holds: an NTLMv1
 * answer is refused, so a client that gets through speaks NTLMv2.
 *
 * Everything Samba keeps (smb.conf, passdb, state, caches, logs) is in a temp dir. The winbind pipe cannot be:
 * Debian's libwbclient (which ntlm_auth and wbinfo use) reads no configuration for it and always connects to its
 * compiled-in /run/samba/winbindd (the SELFTEST_WINBINDD_SOCKET_DIR override works only under Samba's own
 * nss_wrapper builds). So winbindd runs in a mount namespace of its own (`unshare --mount`) in which the lab's
 * run/ directory is bind-mounted on /run/samba, and squid is started in that same namespace (`nsenter -m`), so
 * its ntlm_auth helpers find the lab's winbindd there. Nothing is written to the real /run/samba (only created,
 * empty, as a mount point, as Debian's Samba packages do), a system winbindd is not disturbed, and several labs
 * can run at once.
 *
 * Samba's accounts are Unix accounts: the lab adds an OS user of its own (`useradd`, removed by stop()), so it
 * needs root. The privileged pipe directory (where ntlm_auth's NTLM checks go) is given to squid's group so the
 * helper, which runs as squid's user, can reach it, as Debian's winbindd_priv group does for a system install.
 */
import { execFile, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, chown, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { proxyUser, startSquid, type Squid } from './squid.js';

const run = promisify(execFile);
const NTLM_AUTH = '/usr/bin/ntlm_auth';
const WINBINDD = '/usr/sbin/winbindd';
/** Where Debian's libwbclient looks for winbindd's pipe (in its winbindd/ subdirectory): see the module doc. */
const SAMBA_RUN = '/run/samba';

/** The NTLM domain of the lab's accounts: a standalone Samba server's own NetBIOS name. */
export const NTLM_DOMAIN = 'GWLAB';

export interface NtlmLab {
  dir: string;
  squid: Squid;
  domain: string;
  user: { name: string; password: string };
  /** "GWLAB\\name", as curl's -U and a proxy URL's user part take it. */
  account: string;
  stop(): Promise<void>;
}

function smbConf(dir: string): string {
  return `[global]
  workgroup = GWTEST
  netbios name = ${NTLM_DOMAIN}
  server role = standalone server
  security = user
  passdb backend = tdbsam:${dir}/private/passdb.tdb
  private dir = ${dir}/private
  state directory = ${dir}/state
  lock directory = ${dir}/lock
  cache directory = ${dir}/cache
  pid directory = ${dir}/pid
  ncalrpc dir = ${dir}/ncalrpc
  winbindd socket directory = ${SAMBA_RUN}/winbindd
  log file = ${dir}/log.%m
  disable netbios = yes
  ntlm auth = ntlmv2-only
`;
}

/** True when the winbindd in the mount namespace of process `pid` answers on its pipe. */
async function winbindAnswers(pid: number): Promise<boolean> {
  try {
    await run('nsenter', ['-t', String(pid), '-m', '--', 'wbinfo', '--ping'], { timeout: 5000 });
    return true;
  } catch {
    return false;
  }
}

/** Daemons still running when the test process exits are SIGKILLed (as squid.ts does for squid), OS users removed. */
const running = new Set<ChildProcess>();
const users = new Set<string>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
  for (const user of users) spawnSync('userdel', [user]);
});

/** winbindd in a mount namespace of its own where `runDir` is /run/samba (unshare and sh exec: one pid). */
async function startWinbindd(conf: string, runDir: string): Promise<ChildProcess> {
  const script = `mount --bind "$0" ${SAMBA_RUN} && exec ${WINBINDD} -F --debug-stdout --configfile="$1"`;
  const child = spawn('unshare', ['--mount', '--propagation', 'private', '--', 'sh', '-c', script, runDir, conf], { stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  child.once('exit', () => running.delete(child));
  let out = '';
  const keep = (d: Buffer) => (out = (out + d.toString()).slice(-4000));
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  const deadline = Date.now() + 20_000;
  while (!(await winbindAnswers(child.pid!))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`winbindd did not answer in its mount namespace: ${out}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return child;
}

/** Squid's NTLM: Samba's helper with the lab's smb.conf, and a 407 for anyone it does not accept. */
export function ntlmSquidConfig(conf: string): string[] {
  return [
    `auth_param ntlm program ${NTLM_AUTH} --helper-protocol=squid-2.5-ntlmssp --configfile=${conf}`,
    'auth_param ntlm children 2 startup=1 idle=1',
    'auth_param ntlm keep_alive on',
    'acl ntlm_user proxy_auth REQUIRED',
    'http_access deny !ntlm_user',
  ];
}

export async function startNtlmLab(o: { host?: string; squidConfig?: string[]; clients?: string[] } = {}): Promise<NtlmLab> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-ntlm-'));
  const user = { name: `gwntlm${randomBytes(3).toString('hex')}`, password: `Ntlm-${randomBytes(6).toString('hex')}` };
  const steps: Array<() => Promise<unknown>> = [() => rm(dir, { recursive: true, force: true })];
  const stop = async () => {
    for (const step of steps.splice(0).reverse()) await step().catch((err) => console.error('ntlm lab stop:', err));
  };
  try {
    for (const d of ['private', 'state', 'lock', 'cache', 'pid', 'ncalrpc', 'run']) await mkdir(join(dir, d));
    await mkdir(SAMBA_RUN, { recursive: true }); // the mount point
    const conf = join(dir, 'smb.conf');
    await writeFile(conf, smbConf(dir));
    await run('useradd', ['--no-create-home', '--shell', '/usr/sbin/nologin', '--comment', 'gateway test NTLM lab', user.name]);
    users.add(user.name);
    steps.push(async () => {
      await run('userdel', [user.name]);
      users.delete(user.name);
    });
    await new Promise<void>((resolve, reject) => {
      const child = spawn('smbpasswd', ['-c', conf, '-s', '-a', user.name], { stdio: ['pipe', 'ignore', 'pipe'] });
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`smbpasswd -a failed (${code}): ${err}`))));
      child.stdin.end(`${user.password}\n${user.password}\n`);
    });
    const winbindd = await startWinbindd(conf, join(dir, 'run'));
    steps.push(async () => {
      winbindd.kill('SIGTERM');
      if (winbindd.exitCode === null) await new Promise((r) => winbindd.once('exit', r));
    });
    const owner = proxyUser();
    await chmod(dir, 0o755);
    if (owner) await chown(join(dir, 'state', 'winbindd_privileged'), 0, owner.gid);
    const launcher = ['nsenter', '-t', String(winbindd.pid), '-m', '--'];
    const squid = await startSquid({ host: o.host, launcher, ...(o.clients ? { clients: o.clients } : {}), extraConfig: [...ntlmSquidConfig(conf), ...(o.squidConfig ?? [])] });
    steps.push(() => squid.stop());
    return { dir, squid, domain: NTLM_DOMAIN, user, account: `${NTLM_DOMAIN}\\${user.name}`, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
