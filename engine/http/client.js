// okengine's browser client for live tapes, served at GET /_oke/client.js.
// An ES module with no imports and no build step:
//
//   import { live, flow } from "/_oke/client.js";
//   const stop = await live("", "order-status", { orderId: "o1" }, {
//     onEvent: (event) => console.log(event.id, event.data),
//     headers: { Authorization: "Bearer …" },   // EventSource cannot send this; fetch can
//   });
//   stop();
//
// It follows the same rules as the Python client (engine/client.py): the exposure is chosen from
// /_oke/exposures, a reopening sends Last-Event-ID, and autoResubscribe decides what a drop or a
// 410 does: false (the default) hands it to onError and ends; true reopens after a back-off of
// 500 ms doubling to 30 s, and on a 410 drops the cursor and replays the remaining tape.

export const BACKOFF_MIN_MS = 500;
export const BACKOFF_MAX_MS = 30000;
const IDLE_MS = 45000; // three of the server's 15 s heartbeats: silence this long is a drop

/**
 * @typedef {{id: string, data: any}} LiveEvent
 * @typedef {{
 *   onEvent: (event: LiveEvent) => void,
 *   onError?: (error: LiveError) => void,
 *   onOpen?: () => void,
 *   autoResubscribe?: boolean,
 *   via?: string,
 *   signal?: AbortSignal,
 *   headers?: Record<string, string>,
 *   lastEventId?: string,
 *   idleMs?: number,
 * }} LiveOptions
 * @typedef {{signal: string, path: string, params: string[], custom: boolean, flow: string | null}} Exposure
 */

/**
 * What went wrong, by `name`: "StreamDropped" (`lastId` is the cursor to resume with),
 * "LiveResumeGap" (a 410; `data` has reason, firstId, missed), "HTTPError" (401, 403, 404, …),
 * "BadFrame" (a data frame that is not JSON: the stream goes on), "NoExposure" (the choice failed).
 * `ended` says whether the subscription ended with it.
 */
export class LiveError extends Error {
  /** @param {string} name @param {string} message @param {object} [more] */
  constructor(name, message, more = {}) {
    super(message);
    this.name = name;
    /** @type {number | null} */ this.status = null;
    /** @type {string | null} */ this.lastId = null;
    /** @type {any} */ this.data = null;
    this.ended = true;
    Object.assign(this, more);
  }
}

/** The wait before reopening number `attempt` (0-based): 500 ms doubling to 30 s, jitter only lengthening it. */
export function backoffMs(attempt) {
  const base = Math.min(BACKOFF_MIN_MS * 2 ** Math.min(attempt, 16), BACKOFF_MAX_MS);
  return Math.min(base * (1 + 0.25 * Math.random()), BACKOFF_MAX_MS);
}

/** How a param value is compared on the server, so it goes into the path that way. */
function paramText(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

function fillPath(path, params) {
  return path.replace(/:([A-Za-z_][A-Za-z0-9_]*)/g, (_, name) => encodeURIComponent(paramText(params[name])));
}

function livePath(name) {
  const encoded = encodeURIComponent(name);
  return "/_oke/live/" + (encoded === "." || encoded === ".." ? encoded.replaceAll(".", "%2E") : encoded);
}

function listed(exposures) {
  return exposures.map((e) => `${e.signal} at ${e.path}${e.flow ? ` (flow ${e.flow})` : ""}`).join(", ") || "none";
}

function noExposure(message, exposures) {
  return new LiveError("NoExposure", `${message} (exposures listed to this caller: ${listed(exposures)}; ` +
    "a gated one is listed only to a caller its gate admits: check the headers)");
}

/**
 * The exposure to follow, by the Python client's rule: named by `via` (flow name or path), else among
 * the auto-match exposures the one whose path params are the largest subset of `params`; custom
 * flows never compete; a tie needs `via`. `signal` null: the exposure of the flow named `via`.
 * @param {Exposure[]} exposures @param {string | null} signal @param {object} params @param {string} [via]
 * @returns {Exposure}
 */
export function choose(exposures, signal, params, via) {
  if (signal === null) {
    const found = exposures.find((e) => e.flow === via);
    if (!found) throw noExposure(`flow "${via}": no live exposure is served by a flow of that name`, exposures);
    return found;
  }
  const mine = exposures.filter((e) => e.signal === signal);
  if (mine.length === 0) throw noExposure(`unknown live signal "${signal}": no exposure of it here`, exposures);
  if (via !== undefined && via !== null) {
    const found = mine.find((e) => e.path === via || e.flow === via);
    if (!found) throw noExposure(`via "${via}": no exposure of "${signal}" has that flow name or path`, mine);
    return found;
  }
  const keys = new Set(Object.keys(params));
  const fitting = mine.filter((e) => !e.custom && e.params.every((p) => keys.has(p)));
  if (fitting.length === 0) {
    throw noExposure(`"${signal}" has no exposure whose path params fit [${[...keys].sort().join(", ")}]`, mine);
  }
  const best = Math.max(...fitting.map((e) => new Set(e.params).size));
  const chosen = fitting.filter((e) => new Set(e.params).size === best);
  if (chosen.length > 1) {
    throw noExposure(`"${signal}" has ${chosen.length} exposures that fit equally well: pass via`, chosen);
  }
  return chosen[0];
}

async function errorOf(response, cursor) {
  let error = null;
  try {
    error = (await response.json()).error;
  } catch {
    // not our envelope: a proxy's page
  }
  const message = error && typeof error.message === "string" ? error.message : response.statusText;
  const code = error && typeof error.code === "string" ? error.code : "HTTPError";
  if (response.status === 410) {
    return new LiveError("LiveResumeGap", message, { status: 410, lastId: cursor, data: (error && error.data) || {} });
  }
  const name = [502, 503, 504].includes(response.status) ? "StreamDropped" : "HTTPError";
  return new LiveError(name, `HTTP ${response.status} ${code}: ${message}`, { status: response.status, lastId: cursor });
}

/**
 * Split a text stream into SSE frames (the WHATWG rules: CR, LF or CRLF ends a line; a blank line
 * ends a frame; `field: value` drops one leading space; comments and unknown fields are ignored).
 */
class FrameParser {
  constructor() {
    this.buffer = "";
    this.data = [];
    this.id = null;
    this.skipLF = false; // the last chunk ended with CR: an LF opening the next one is its CRLF's half
  }

  /** @param {string} text @param {(frame: {id: string | null, data: string | null}) => void} emit */
  push(text, emit) {
    if (this.skipLF && text.startsWith("\n")) text = text.slice(1);
    this.skipLF = text.endsWith("\r");
    this.buffer += text;
    const lines = this.buffer.split(/\r\n|\r|\n/);
    this.buffer = lines.pop() ?? ""; // the unfinished line waits for the next chunk
    for (const line of lines) {
      if (line === "") {
        emit({ id: this.id, data: this.data.length ? this.data.join("\n") : null });
        this.data = [];
        this.id = null;
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") this.data.push(value);
      else if (field === "id" && !value.includes("\0")) this.id = value;
    }
  }
}

/** One subscription: its cursor, its back-off, and whether it has been stopped. */
class Subscription {
  /** @param {string} url @param {string} label @param {LiveOptions} options */
  constructor(url, label, options) {
    this.url = url;
    this.label = label;
    this.options = options;
    this.cursor = options.lastEventId || null;
    this.attempt = 0;
    this.stopped = false;
    this.controller = null;
    this.timer = null;
  }

  stop() {
    if (this.stopped) return;
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
  }

  fail(error) {
    if (this.stopped) return;
    if (error.ended) this.stop();
    if (this.options.onError) this.options.onError(error);
  }

  async run() {
    while (!this.stopped) {
      const error = await this.connect();
      if (this.stopped) return;
      const retry = this.options.autoResubscribe && (error.name === "StreamDropped" || error.name === "LiveResumeGap");
      if (!retry) {
        this.fail(error);
        return;
      }
      if (error.name === "LiveResumeGap") this.cursor = null; // replay the remaining tape
      await new Promise((resolve) => { this.timer = setTimeout(resolve, backoffMs(this.attempt)); });
      this.attempt += 1;
    }
  }

  /** One connection, until it ends; the LiveError that ended it. */
  async connect() {
    const controller = new AbortController();
    this.controller = controller;
    const headers = { ...(this.options.headers || {}), Accept: "text/event-stream" };
    if (this.cursor) headers["Last-Event-ID"] = this.cursor;
    const idleMs = this.options.idleMs ?? IDLE_MS;
    let idle = null;
    const quiet = () => {
      clearTimeout(idle);
      if (idleMs > 0) idle = setTimeout(() => controller.abort(), idleMs);
    };
    try {
      quiet();
      const response = await fetch(this.url, { headers, signal: controller.signal, cache: "no-store" });
      if (response.status !== 200) return await errorOf(response, this.cursor);
      this.attempt = 0;
      if (this.options.onOpen && !this.stopped) this.options.onOpen();
      return await this.read(response, quiet);
    } catch (err) {
      return this.dropped(err);
    } finally {
      clearTimeout(idle);
      controller.abort();
    }
  }

  async read(response, quiet) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new FrameParser();
    let ended = false;
    while (!ended) {
      const { value, done } = await reader.read();
      if (done || this.stopped) break;
      quiet();
      parser.push(value, (frame) => {
        if (frame.id !== null) this.cursor = frame.id;
        if (frame.data === null || this.stopped || ended) return;
        if (frame.data === "[DONE]") {
          ended = true; // the server is going away
          return;
        }
        let data;
        try {
          data = JSON.parse(frame.data);
        } catch {
          const shown = frame.data.length > 80 ? frame.data.slice(0, 80) + "…" : frame.data;
          this.fail(new LiveError("BadFrame", `live "${this.label}": a data frame that is not JSON ` +
            `(id ${JSON.stringify(frame.id)}): ${JSON.stringify(shown)}`, { ended: false, lastId: frame.id }));
          return;
        }
        this.options.onEvent({ id: frame.id ?? "", data });
      });
    }
    return this.dropped(new Error(ended ? "the server ended the stream (it is shutting down)" : "the connection closed"));
  }

  dropped(cause) {
    const why = cause && cause.name === "AbortError" ? "silent for too long, or aborted" : String(cause && cause.message);
    const after = this.cursor ? ` after "${this.cursor}"` : "";
    return new LiveError("StreamDropped", `live "${this.label}": the stream dropped${after} (${why})`, { lastId: this.cursor });
  }
}

function checkOptions(options) {
  if (!options || typeof options.onEvent !== "function") {
    throw new TypeError("live(...): options.onEvent must be a function");
  }
  for (const name of ["onError", "onOpen"]) {
    if (options[name] !== undefined && typeof options[name] !== "function") {
      throw new TypeError(`live(...): options.${name} must be a function`);
    }
  }
}

async function subscribe(baseUrl, signal, params, options, via) {
  checkOptions(options);
  if (options.signal && options.signal.aborted) return () => {};
  const base = String(baseUrl || "").replace(/\/+$/, "");
  const response = await fetch(`${base}/_oke/exposures`, { headers: options.headers || {}, cache: "no-store" });
  if (!response.ok) throw await errorOf(response, null);
  /** @type {Exposure[]} */
  const exposures = (await response.json()).data;
  const chosen = choose(exposures, signal, params, via);
  const missing = chosen.params.filter((p) => !Object.hasOwn(params, p));
  if (missing.length) {
    throw new LiveError("NoExposure", `"${chosen.signal}" at ${chosen.path} needs the params ${missing.join(", ")}`);
  }
  const label = signal === null ? `flow ${via}` : signal;
  const subscription = new Subscription(base + fillPath(chosen.path, params), label, options);
  const stop = () => subscription.stop();
  if (options.signal) {
    if (options.signal.aborted) return stop; // aborted while the listing was read: never opens
    options.signal.addEventListener("abort", stop, { once: true });
  }
  subscription.run();
  return stop;
}

/**
 * Follow a live signal's tape; resolves to `stop()` once the exposure is chosen, rejects with a
 * LiveError ("NoExposure") naming the signal and the exposures there are when none fits.
 * @param {string} baseUrl the server ("" for this page's own origin)
 * @param {string} signal
 * @param {object} [params] path params, e.g. {orderId: "o1"}
 * @param {LiveOptions} options
 * @returns {Promise<() => void>}
 */
export function live(baseUrl, signal, params, options) {
  if (typeof signal !== "string" || signal === "") {
    return Promise.reject(new TypeError("live(baseUrl, signal, ...): the signal is its name, a non-empty string"));
  }
  return subscribe(baseUrl, signal, params || {}, options, options && options.via);
}

/**
 * The per-flow form: `flow(baseUrl, "orders.vip").live(params, options)` follows the exposure the
 * flow of that name serves (its signal and path come from the listing).
 * @param {string} baseUrl @param {string} name
 */
export function flow(baseUrl, name) {
  return {
    /** @param {object} [params] @param {LiveOptions} options @returns {Promise<() => void>} */
    live(params, options) {
      if (typeof name !== "string" || name === "") {
        return Promise.reject(new TypeError("flow(baseUrl, name): the flow's name, a non-empty string"));
      }
      return subscribe(baseUrl, null, params || {}, options, name);
    },
  };
}
