/**
 * The managed rollout's controller in the Auth Service: runs the planner (plan.ts) every interval
 * (auth_service.autoupdate_interval, 15 s by default) and soon after every change of the two resources or of the
 * agents' presence (a watch, coalesced), stores the state in one backend key, records what changed in the audit
 * log and the metrics, and answers the instruction, the status and the operators' commands.
 *
 * Several Auth Services on one PostgreSQL step the same rollout: each write of the state is conditioned on the
 * revision it read (exists: false for the first), so a step computed from a state another Auth Service has
 * replaced meanwhile is refused whole and computed again from the new one; its events are recorded only by the
 * writer whose write went through, so each is recorded once.
 */
import { watchAcrossGaps, type Backend, type Item } from '../../backend/index.js';
import { GatewayError, isGatewayError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { recordRolloutHalt, recordRolloutStatus } from '../../metrics/autoupdate.js';
import type { AgentInstruction, RolloutStatus } from '../../wire/autoupdate.js';
import type { AgentDirectory } from '../agents.js';
import type { AuditLog } from '../audit.js';
import type { CallerCheck } from '../callers.js';
import type { Identity } from '../pki.js';
import { KEYS, parseJson } from '../records.js';
import type { AutoupdateConfig, AutoupdateVersion } from '../resources/index.js';
import { applyCommand, type CommandInput } from './commands.js';
import { instructionFor } from './instruction.js';
import { step, type PlanInput } from './plan.js';
import type { RolloutAgent, RolloutEvent, RolloutState } from './state.js';
import { statusOf } from './status.js';

export const DEFAULT_AUTOUPDATE_INTERVAL_MS = 15_000;
/** How often a step computed from a replaced state is computed again before giving up (GW_ERR_AUTOUPDATE_CONFLICT). */
const WRITE_ATTEMPTS = 4;
/** Inputs read for an instruction are reused this long: a flood of upgraders costs one read of the presence. */
const INPUT_TTL_MS = 1000;
/** A change seen by the watch is stepped after this pause, so a burst of presence writes makes one step. */
const WATCH_DEBOUNCE_MS = 250;

export interface RolloutControllerDeps {
  backend: Backend;
  agents: AgentDirectory;
  audit: AuditLog;
  callers: CallerCheck;
  clock: () => number;
  /** The Auth Service's own version: the control plane's, for the safety rules. */
  controlPlane: string;
  log: Logger;
}

interface Inputs {
  input: PlanInput;
  /** The state's stored item (its revision conditions the write). */
  item: Item | undefined;
}

export class RolloutController {
  private timer: NodeJS.Timeout | undefined;
  private debounce: NodeJS.Timeout | undefined;
  private stops: Array<() => void> = [];
  private running: Promise<void> | undefined;
  private cached: { at: number; inputs: Promise<Inputs> } | undefined;

  constructor(private readonly deps: RolloutControllerDeps) {}

  /** Steps every intervalMs and after every change of the resources or the presence. */
  start(intervalMs = DEFAULT_AUTOUPDATE_INTERVAL_MS): void {
    if (this.timer) return;
    this.timer = setInterval(() => this.kick(), intervalMs);
    this.timer.unref();
    const soon = () => {
      this.cached = undefined;
      if (this.debounce) return;
      this.debounce = setTimeout(() => {
        this.debounce = undefined;
        this.kick();
      }, WATCH_DEBOUNCE_MS);
      this.debounce.unref();
    };
    this.stops = ['/autoupdate/config', '/autoupdate/version', '/presence/'].map((prefix) => watchAcrossGaps(this.deps.backend, prefix, soon, soon));
    this.kick();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    if (this.debounce) clearTimeout(this.debounce);
    this.timer = undefined;
    for (const s of this.stops) s();
    this.stops = [];
    await this.running;
  }

  /** One step now, unless one is running (then that one is awaited). */
  kick(): Promise<void> {
    const running =
      this.running ??
      this.tick().then(
        () => undefined,
        (err: unknown) => this.deps.log.warn({ err: (err as Error).message }, 'rollout step failed; the next one tries again'),
      ).finally(() => {
        this.running = undefined;
      });
    this.running = running;
    return running;
  }

  /** One step of the planner, written conditionally; returns the events it recorded. */
  async tick(): Promise<RolloutEvent[]> {
    for (let attempt = 0; attempt < WRITE_ATTEMPTS; attempt++) {
      const { input, item } = await this.read();
      const out = step(input);
      if (await this.write(item, input.state, out.state)) {
        this.cached = undefined;
        await this.recordEvents(out.events, undefined);
        recordRolloutStatus(statusOf({ ...input, state: out.state }));
        return out.events;
      }
    }
    throw new GatewayError('GW_ERR_AUTOUPDATE_CONFLICT', `the rollout's state changed under ${WRITE_ATTEMPTS} steps in a row`);
  }

  /** The state written only when it changed, on the condition that it is still the one read. */
  private async write(item: Item | undefined, before: RolloutState | undefined, after: RolloutState | undefined): Promise<boolean> {
    if (JSON.stringify(before) === JSON.stringify(after)) return true;
    const key = KEYS.autoupdateRollout;
    const condition = item ? { key, revision: item.revision } : { key, exists: false as const };
    const op = after === undefined ? { type: 'delete' as const, key } : { type: 'put' as const, key, value: JSON.stringify(after) };
    try {
      await this.deps.backend.atomicWrite([condition], [op]);
      return true;
    } catch (err) {
      if (isGatewayError(err, 'GW_ERR_BACKEND_CONFLICT')) return false;
      throw err;
    }
  }

  private async recordEvents(events: readonly RolloutEvent[], caller: Identity | undefined): Promise<void> {
    for (const e of events) {
      if (e.type === 'autoupdate.halted') recordRolloutHalt();
      this.deps.log.info({ event: e.type, group: e.group, rollout_id: e.rollout_id }, e.reason);
      const { type, ...fields } = e;
      await this.deps.audit.record(type, caller, fields);
    }
  }

  /** The resources, the stored state and the connected agents. */
  private async read(): Promise<Inputs> {
    const { backend } = this.deps;
    const [config, version, item, online] = await Promise.all([
      backend.get(KEYS.autoupdateConfig),
      backend.get(KEYS.autoupdateVersion),
      backend.get(KEYS.autoupdateRollout),
      this.deps.agents.agentsOnline(),
    ]);
    const agents: RolloutAgent[] = [...online.values()].map((p) => ({
      hostId: p.hostId,
      nodename: p.nodename,
      connectedAt: p.connectedAt,
      lastHeartbeat: p.lastHeartbeat,
      ...(p.version === undefined ? {} : { version: p.version }),
      ...(p.upgradeGroup === undefined ? {} : { upgradeGroup: p.upgradeGroup }),
      ...(p.health === undefined ? {} : { health: p.health }),
    }));
    const input: PlanInput = {
      config: parseJson<AutoupdateConfig>(config)?.spec,
      version: parseJson<AutoupdateVersion>(version)?.spec,
      state: parseJson<RolloutState>(item),
      agents,
      controlPlane: this.deps.controlPlane,
      now: this.deps.clock(),
    };
    return { input, item };
  }

  /** Inputs at most INPUT_TTL_MS old, for the instruction and the status. */
  private recent(): Promise<Inputs> {
    const now = this.deps.clock();
    if (!this.cached || now - this.cached.at > INPUT_TTL_MS) {
      const inputs = this.read();
      this.cached = { at: now, inputs };
      inputs.catch(() => {
        if (this.cached?.inputs === inputs) this.cached = undefined;
      });
    }
    return this.cached.inputs.then((i) => ({ ...i, input: { ...i.input, now } }));
  }

  /** What a host should run (a Proxy asks for its upgraders: GET /v1/autoupdate/instruction). */
  async instruction(hostId: string, group?: string): Promise<AgentInstruction> {
    return instructionFor((await this.recent()).input, hostId, group);
  }

  /** GET /v1/autoupdate/status: a caller allowed to read autoupdate_agent_rollout. */
  async status(caller?: Identity): Promise<RolloutStatus> {
    if (caller) await this.deps.callers.authorize(caller, 'autoupdate_agent_rollout', 'read');
    return statusOf((await this.recent()).input);
  }

  /** An operator's command, written on the state it read, then one step so that it shows at once. */
  async command(caller: Identity, command: Omit<CommandInput, 'by'>): Promise<RolloutStatus> {
    await this.deps.callers.authorizeAny(caller, ['autoupdate_version', 'autoupdate_agent_rollout'], ['update']);
    for (let attempt = 0; attempt < WRITE_ATTEMPTS; attempt++) {
      const { input, item } = await this.read();
      const stepped = step(input);
      const current = stepped.state;
      if (!current) {
        throw new GatewayError('GW_ERR_AUTOUPDATE_NOT_CONFIGURED', `there is no rollout to ${command.command}: no autoupdate_version sets a target`);
      }
      const { state, event } = applyCommand(current, { ...command, by: caller.name }, input.now);
      if (await this.write(item, input.state, state)) {
        this.cached = undefined;
        await this.recordEvents(stepped.events, undefined);
        await this.recordEvents([event], caller);
        await this.kick();
        return this.status();
      }
    }
    throw new GatewayError('GW_ERR_AUTOUPDATE_CONFLICT', `the rollout's state changed under ${WRITE_ATTEMPTS} attempts of ${command.command}`);
  }
}
