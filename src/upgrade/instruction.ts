/**
 * What a managed rollout tells this host to run (docs/upgrades.md, "Managed rollouts"), asked of the Proxy the
 * endpoint file names before anything else, through the Dialer like every other request of the upgraders:
 *
 *   GET https://<host:port>/v1/webapi/autoupdate/agent?host_id=<this host>[&group=<group file>]
 *     404                   a Proxy of an earlier version: no rollout; the seed's channel and windows decide.
 *     200 managed:false     no rollout resources (or disabled): the same.
 *     200 managed:true      the instruction decides (version, update, reason); the channel is not asked.
 *     anything else         GW_ERR_UPGRADE_INSTRUCTION: the upgrader does nothing and exits 1. It never falls back
 *                           to the channel then, since a rollout in progress (a halt, a rollback) must not be bypassed.
 *
 * The answer is bounded (AGENT_INSTRUCTION_MAX_BYTES), has a deadline for the whole request (not only between
 * bytes, so a Proxy that drips cannot hold the timer's run), and is parsed strictly (parseAgentInstruction).
 * The host's ID is the agent's: <data_dir>/host/identity.json (GATEWAY_UPGRADE_DATA_DIR); a host that has not
 * joined has none, is in no rollout, and keeps the channel's behaviour.
 *
 * fetchInstruction is shared with the Kubernetes updater (its own host_id and group).
 */
import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';
import { join } from 'node:path';
import { GatewayError, toGatewayError } from '../errors.js';
import { isTlsVerifyError } from '../dial/tlsverify.js';
import { AGENT_INSTRUCTION_MAX_BYTES, AUTOUPDATE_AGENT_PATH, parseAgentInstruction, UPGRADE_GROUP_PATTERN, type AgentInstruction } from '../wire/autoupdate.js';
import { getFromProxy, type HttpDeps } from './client.js';

/** The file an operator may write to ask for a group (one line); the agent's own group comes from its config. */
export const GROUP_FILE = 'group';
const SMALL_FILE_MAX = 64 * 1024;
const HOST_ID = /^[A-Za-z0-9-]{1,64}$/;

/** Reads a small regular file, at most max bytes (non-blocking open: a FIFO put there cannot hold the run). */
function readSmall(path: string, max: number): string | undefined {
  let fd: number | undefined;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
    if (!fstatSync(fd).isFile()) return undefined;
    const buf = Buffer.alloc(max + 1);
    const n = readSync(fd, buf, 0, buf.length, 0);
    return n > max ? undefined : buf.subarray(0, n).toString('utf8');
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** This host's ID from the agent's stored identity (<dataDir>/host/identity.json); undefined when it has none. */
export function readHostId(dataDir: string): string | undefined {
  const text = readSmall(join(dataDir, 'host', 'identity.json'), SMALL_FILE_MAX);
  if (text === undefined) return undefined;
  try {
    const id = (JSON.parse(text) as { hostId?: unknown }).hostId;
    return typeof id === 'string' && HOST_ID.test(id) ? id : undefined;
  } catch {
    return undefined;
  }
}

/** The group file's group (etcDir/group): undefined when absent; GW_ERR_UPGRADE_INSTRUCTION when it is not a name. */
export function readGroupFile(etcDir: string): string | undefined {
  const path = join(etcDir, GROUP_FILE);
  const text = readSmall(path, 256);
  if (text === undefined) return undefined;
  const group = text.trim();
  if (group === '') return undefined;
  if (!UPGRADE_GROUP_PATTERN.test(group)) {
    throw new GatewayError('GW_ERR_UPGRADE_INSTRUCTION', `${path} names the group ${JSON.stringify(group.slice(0, 64))}, which is not a group name`, {
      hint: `Write one group name (1 to 32 of a-z, 0-9 and "-") in ${path}, or remove it to use the agent's own group.`,
      details: { path },
    });
  }
  return group;
}

export type InstructionAnswer = { kind: 'none'; why: string } | { kind: 'instruction'; instruction: AgentInstruction; proxy?: string };

function instructionError(url: string, why: string, hint: string | undefined, details: Record<string, unknown>, cause?: unknown): GatewayError {
  return new GatewayError('GW_ERR_UPGRADE_INSTRUCTION', `cannot read this host's rollout instruction from ${url}: ${why}; nothing was installed`, {
    ...(hint ? { hint } : {}),
    details: { url, ...details },
    ...(cause === undefined ? {} : { cause }),
  });
}

/**
 * Asks origin (https://host:port) for hostId's instruction. 404 → none (an earlier Proxy); a managed:false answer is
 * returned as it is (the caller keeps the channel). Throws GW_ERR_UPGRADE_INSTRUCTION (or a TLS code) otherwise.
 */
export async function fetchInstruction(origin: string, query: { hostId: string; group?: string }, deps: HttpDeps & { deadlineMs?: number }): Promise<InstructionAnswer> {
  const params = new URLSearchParams({ host_id: query.hostId, ...(query.group ? { group: query.group } : {}) });
  const url = `${origin}${AUTOUPDATE_AGENT_PATH}?${params.toString()}`;
  const deadlineMs = deps.deadlineMs ?? 15_000;
  let r: { status: number; body: string; proxy?: string };
  try {
    r = await getFromProxy(url, { ...deps, timeoutMs: Math.min(deps.timeoutMs ?? deadlineMs, deadlineMs) }, AGENT_INSTRUCTION_MAX_BYTES, AbortSignal.timeout(deadlineMs));
  } catch (err) {
    const e = toGatewayError(err);
    const tlsProblem: boolean = isTlsVerifyError(e);
    if (tlsProblem) throw new GatewayError(e.code, `cannot ask ${url}: ${e.message}; nothing was installed`, { cause: e, ...(e.hint ? { hint: e.hint } : {}), details: { url } });
    const aborted = (err as Error).name === 'AbortError' || /abort/i.test(e.message);
    const why = aborted ? `no complete answer within ${Math.round(deadlineMs / 100) / 10} s` : e.code === 'GW_ERR_HTTP_TOO_LARGE' ? `the answer is larger than ${AGENT_INSTRUCTION_MAX_BYTES} bytes` : e.message;
    throw instructionError(url, why, 'Check that the Proxy in the endpoint file is reachable from this host (through HTTPS_PROXY if set); the next run asks again. The channel is not used while the rollout cannot be read.', { cause: e.code }, e);
  }
  const from = r.proxy ? ` (Proxy ${r.proxy})` : '';
  if (r.status === 404) return { kind: 'none', why: `${url} answered 404${from}: the Proxy serves no rollout (an earlier version)` };
  if (r.status !== 200) {
    throw instructionError(url, `the Proxy answered HTTP ${r.status}${from}`, 'The Proxy or its Auth Service failed to answer; check their logs. The next run asks again; the channel is not used meanwhile.', { status: r.status });
  }
  const parsed = parseAgentInstruction(r.body);
  if (!parsed.ok) {
    throw instructionError(url, `the answer is not an instruction (${parsed.why})${from}`, 'The Proxy answered something other than an instruction: check that the endpoint file names the cluster\'s Proxy, and its version.', { why: parsed.why });
  }
  return { kind: 'instruction', instruction: parsed.instruction, ...(r.proxy ? { proxy: r.proxy } : {}) };
}

/** The sentence run and dry-run print for an instruction. */
export function instructionLine(i: AgentInstruction): string {
  const where = i.group === undefined ? 'no group' : i.group === '' ? 'no group (the catch-all is disabled)' : `group ${i.group}${i.canary ? ', a canary' : ''}`;
  return `rollout${i.rollout_id ? ` ${i.rollout_id}` : ''}: ${where}; ${i.version ? `target ${i.version}` : 'no target set'}, ${i.update ? 'update now' : 'not now'}: ${i.reason}`;
}
