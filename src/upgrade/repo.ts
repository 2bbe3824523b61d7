/**
 * The package repository entry:
 *
 *   apt:           /etc/apt/sources.list.d/gateway.list
 *                  deb [signed-by=/usr/share/keyrings/gateway-archive-keyring.asc] {repo_url}/debian bookworm stable/v17
 *   yum, dnf:      /etc/yum.repos.d/gateway.repo     baseurl={repo_url}/rhel/9/Gateway/$basearch/stable/v17
 *   zypper:        /etc/zypp/repos.d/gateway.repo    (same INI form)
 *
 * The channel is the apt component, or the end of the baseurl: `stable/v<major>` (one major version) or
 * `stable/rolling` (every version from v13.3.2 on, future majors included). A per-major channel cannot install a
 * new major: the upgrader says the repository must move and moves it only when told to (setChannel).
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import semver from 'semver';
import { GatewayError } from '../errors.js';
import { PUBLIC_DIR_MODE, writeFileAtomic } from '../fsutil.js';
import type { PackageManager } from './packages.js';
import { DEFAULT_REPO_ID } from './packages.js';
import type { UpgraderSettings } from './settings.js';

export const APT_LIST = 'gateway.list';
export const RPM_REPO = 'gateway.repo';
export const ROLLING_CHANNEL = 'stable/rolling';
export const APT_KEYRING = '/usr/share/keyrings/gateway-archive-keyring.asc';

const CHANNEL = /^stable\/(v\d+|rolling|cloud)$/;

export interface RepoEntry {
  kind: 'apt' | 'rpm';
  path: string;
  text: string;
  /** The channel found (stable/v17, stable/rolling), or undefined when the entry names none we recognise. */
  channel: string | undefined;
  /** yum / dnf / zypper: the INI section (repository id). */
  repoId?: string;
}

export function repoPath(pm: PackageManager, s: Pick<UpgraderSettings, 'aptSourcesDir' | 'yumReposDir' | 'zyppReposDir'>): string {
  if (pm === 'apt') return join(s.aptSourcesDir, APT_LIST);
  if (pm === 'zypper') return join(s.zyppReposDir, RPM_REPO);
  return join(s.yumReposDir, RPM_REPO);
}

/** Splits a one-line-style apt source: deb [options] uri suite component... (options may hold spaces). */
function aptTokens(line: string): { head: string; tokens: string[] } | undefined {
  const m = /^\s*(deb)\s+(\[[^\]]*\]\s+)?(.*)$/.exec(line);
  if (!m) return undefined;
  return { head: `${m[1]} ${m[2] ?? ''}`, tokens: m[3]!.trim().split(/\s+/) };
}

export function parseAptList(text: string): string | undefined {
  for (const line of text.split('\n')) {
    if (line.trim().startsWith('#')) continue;
    const t = aptTokens(line);
    if (!t || t.tokens.length < 2) continue;
    const components = t.tokens.slice(2);
    return components.find((c) => CHANNEL.test(c)) ?? components[0];
  }
  return undefined;
}

export function setAptChannel(text: string, channel: string): string {
  let done = false;
  const out = text.split('\n').map((line) => {
    if (done || line.trim().startsWith('#')) return line;
    const t = aptTokens(line);
    if (!t || t.tokens.length < 2) return line;
    const [uri, suite, ...components] = t.tokens;
    const i = components.findIndex((c) => CHANNEL.test(c));
    if (i >= 0) components[i] = channel;
    else if (components.length > 0) components[0] = channel;
    else components.push(channel);
    done = true;
    return `${t.head}${[uri, suite, ...components].join(' ')}`;
  });
  return out.join('\n');
}

/** The section and baseurl of the first repository in a .repo file. */
export function parseRpmRepo(text: string): { repoId: string | undefined; channel: string | undefined } {
  let repoId: string | undefined;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    const section = /^\[([^\]]+)\]$/.exec(line);
    if (section) {
      if (repoId !== undefined) break;
      repoId = section[1]!.trim();
      continue;
    }
    const base = /^baseurl\s*=\s*(\S+)/.exec(line);
    if (base && repoId !== undefined) {
      const m = /(stable\/[^/\s]+)\/?$/.exec(base[1]!);
      return { repoId, channel: m?.[1] };
    }
  }
  return { repoId, channel: undefined };
}

export function setRpmChannel(text: string, channel: string): string {
  let done = false;
  return text
    .split('\n')
    .map((line) => {
      if (done) return line;
      const m = /^(\s*baseurl\s*=\s*)(\S+?)(\/?)(\s*)$/.exec(line);
      if (!m) return line;
      done = true;
      const url = m[2]!;
      const replaced = /stable\/[^/\s]+$/.test(url) ? url.replace(/stable\/[^/\s]+$/, channel) : `${url}/${channel}`;
      return `${m[1]}${replaced}${m[3]}${m[4]}`;
    })
    .join('\n');
}

/** The line of the entry that moving it to `channel` changes, as it would read afterwards (what the operator writes). */
export function movedLine(entry: Pick<RepoEntry, 'kind' | 'text'>, channel: string): string | undefined {
  const before = entry.text.split('\n');
  const after = (entry.kind === 'apt' ? setAptChannel(entry.text, channel) : setRpmChannel(entry.text, channel)).split('\n');
  return after.find((line, i) => line !== before[i])?.trim();
}

export async function readRepo(pm: PackageManager, s: Pick<UpgraderSettings, 'aptSourcesDir' | 'yumReposDir' | 'zyppReposDir'>): Promise<RepoEntry | undefined> {
  const path = repoPath(pm, s);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return undefined;
    throw new GatewayError('GW_ERR_UPGRADE_REPO', `cannot read the repository entry ${path} (${code ?? 'error'})`, { cause: err });
  }
  if (pm === 'apt') return { kind: 'apt', path, text, channel: parseAptList(text) };
  const { repoId, channel } = parseRpmRepo(text);
  return { kind: 'rpm', path, text, channel, ...(repoId ? { repoId } : {}) };
}

/** `stable/v<major of version>`. */
export function channelFor(version: string): string {
  const v = semver.parse(version.replace(/^v/, ''));
  if (!v) throw new GatewayError('GW_ERR_INTERNAL', `not a version: ${version}`);
  return `stable/v${v.major}`;
}

/**
 * Whether a repository on `channel` can hold `target`; when it cannot, the channel it should move to. Channels
 * the upgrader does not recognise are assumed to hold it (the install itself will tell).
 */
export function channelHolds(channel: string | undefined, target: string): { ok: true } | { ok: false; move: string } {
  if (channel === undefined) return { ok: true };
  const m = /^stable\/v(\d+)$/.exec(channel);
  if (!m) return { ok: true };
  const needed = channelFor(target);
  return needed === channel ? { ok: true } : { ok: false, move: needed };
}

export function validChannel(channel: string): boolean {
  return CHANNEL.test(channel);
}

async function osRelease(root: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const p of ['etc/os-release', 'usr/lib/os-release']) {
    try {
      for (const line of (await readFile(join(root, p), 'utf8')).split('\n')) {
        const m = /^([A-Z_]+)=(.*)$/.exec(line.trim());
        if (m) out[m[1]!] = m[2]!.replace(/^["']|["']$/g, '');
      }
      return out;
    } catch {
      // try the next
    }
  }
  return out;
}

/** A new entry for this host (used when the file does not exist yet). */
export async function newRepoText(pm: PackageManager, channel: string, s: Pick<UpgraderSettings, 'root' | 'aptRepoUrl' | 'yumRepoUrl'>): Promise<string> {
  const os = await osRelease(s.root);
  if (pm === 'apt') {
    const id = os.ID ?? 'debian';
    const codename = os.VERSION_CODENAME ?? 'stable';
    return `# Gateway packages; the last word is the release channel (gateway-upgrade repo set-channel changes it).\ndeb [signed-by=${APT_KEYRING}] ${s.aptRepoUrl}/${id} ${codename} ${channel}\n`;
  }
  const id = os.ID ?? 'rhel';
  const versionId = (os.VERSION_ID ?? '9').split('.')[0];
  return [
    `[${DEFAULT_REPO_ID}]`,
    'name=Gateway',
    // dnf, yum and zypper expand $basearch in a .repo file (an rpm macro such as %{_arch} would stay as it is).
    `baseurl=${s.yumRepoUrl}/${id}/${versionId}/Gateway/$basearch/${channel}`,
    'enabled=1',
    'gpgcheck=1',
    'repo_gpgcheck=1',
    `gpgkey=${s.yumRepoUrl}/gpg`,
    '',
  ].join('\n');
}

/** Moves the repository entry to `channel` (creating the entry when there is none); returns the new entry. */
export async function setChannel(pm: PackageManager, channel: string, s: Pick<UpgraderSettings, 'root' | 'aptSourcesDir' | 'yumReposDir' | 'zyppReposDir' | 'aptRepoUrl' | 'yumRepoUrl'>): Promise<RepoEntry> {
  if (!validChannel(channel)) {
    throw new GatewayError('GW_ERR_UPGRADE_REPO', `${JSON.stringify(channel)} is not a release channel`, {
      hint: 'Channels are stable/v<major> (e.g. stable/v17) or stable/rolling.',
    });
  }
  const current = await readRepo(pm, s);
  const text = current ? (pm === 'apt' ? setAptChannel(current.text, channel) : setRpmChannel(current.text, channel)) : await newRepoText(pm, channel, s);
  const path = repoPath(pm, s);
  try {
    writeFileAtomic(path, text, { mode: 0o644, dirMode: PUBLIC_DIR_MODE });
  } catch (err) {
    throw new GatewayError('GW_ERR_UPGRADE_REPO', `cannot write the repository entry ${path} (${(err as NodeJS.ErrnoException).code ?? 'error'})`, { cause: err });
  }
  const after = await readRepo(pm, s);
  return after!;
}
