"""Set-up shared by audit and clean: the model's context, the fields and their measurements,
the token counter and the limits, resolved once from the user's options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lengthscan.engines.model_context import (
    ceilings,
    counting_settings,
    model_context,
    model_limits_for,
    token_counter,
)
from lengthscan.engines.options import MeasureOptions, RuleOptions
from lengthscan.engines.trainers import prepare_pairs, prepare_prompts
from lengthscan.measure.batch import AudioSettings, role_fields
from lengthscan.measure.columns import ColumnError
from lengthscan.measure.setup import Setup

if TYPE_CHECKING:
    from lengthscan.policy.rules import Rule


def prepare(m: MeasureOptions) -> Setup:
    """Load the model's context, choose the fields and their measurements, the counter and limits."""
    if m.chosen or m.rejected:
        return prepare_pairs(m)
    if m.rl:
        return prepare_prompts(m)
    fmt = _chat_format(m.messages, m.prompt, m.completion, m.tools, m.chat_template, m.images,
                       m.processor or m.max_pixels or m.pan_and_scan or m.videos or m.audios, m.reasoning)
    processor = _processor_source(fmt, m.processor, m.model)
    videos, audios = _video_counter(fmt, processor, m), _audio_counter(fmt, processor, m.audios)
    if fmt is not None and processor is not None:
        from dataclasses import replace

        vision = bool(m.images or m.max_pixels or m.pan_and_scan) or _has_image_processor(processor)
        fmt = replace(fmt, vision=vision, videos=m.videos if videos else None, video=videos is not None,
                      audios=m.audios if audios else None, audio=audios is not None)
    ctx = model_context(m.model, m.tokenizer)
    settings = _audio_settings(ctx, m.sampling_rate) if m.audio else AudioSettings()
    fields = role_fields(input=m.input, target=m.target, audio=m.audio, audio_settings=settings, chat=fmt)
    counter = token_counter(fields, m.tokenizer, m.model, ctx, counting_settings(m))
    chat = _chat_counter(counter, fmt, m.chat_template, m.train_on, processor,
                         {"max_pixels": m.max_pixels, "pan_and_scan": m.pan_and_scan}, videos, audios,
                         tokenizer_source=m.tokenizer or m.model)
    model_limits = model_limits_for(ctx)
    if fmt is not None and model_limits is not None:  # a conversation is the decoder's whole input
        model_limits = model_limits.for_conversations()
    return Setup(fields, counter, settings, model_limits, ceilings(fields, counter, model_limits), chat=chat)


def with_identity(setup: Setup, src, id_column: str | None) -> Setup:
    """``setup`` with ``--id COL``'s field, checked against ``src`` (its type, and a name apart)."""
    from dataclasses import replace

    from lengthscan.measure.columns import identity_field

    if id_column is None:
        return setup
    reserved = {"row", "split", "source_file", "file_row", *(s.name for s in setup.specs)}
    reserved |= {n for f in setup.fields for n in f.notes} | {f"{f.role}_{k}" for f in setup.fields
                                                              for k in ("flag", "error")}
    return replace(setup, identity=identity_field(src, id_column, reserved))


def _chat_format(messages, prompt, completion, tools, chat_template, images=None, vision=None, reasoning=False):
    """The conversation columns asked for (None: no conversation field)."""
    if not (messages or prompt or completion):
        if tools or chat_template or images or vision or reasoning:
            raise ColumnError("--tools, --chat-template, --images, --processor and --reasoning go with a "
                              "conversation: --messages COL, or --prompt COL --completion COL")
        return None
    if messages and (prompt or completion):
        raise ColumnError("give --messages COL, or --prompt COL with --completion COL, not both")
    if not messages and not (prompt and completion):
        raise ColumnError("TRL's prompt-completion form needs both --prompt COL and --completion COL")
    from lengthscan.measure.chat.conversations import ChatFormat

    return ChatFormat(messages=messages, prompt=prompt, completion=completion, tools=tools, images=images,
                      vision=bool(images or vision), reasoning=bool(reasoning))


def _processor_source(fmt, processor, model):
    """Where the image processor comes from: --processor, else the --model's (vision formats)."""
    if fmt is None or not fmt.vision:
        return None
    source = processor or model
    if source is None:
        raise ColumnError("--images needs the model's processor to count image tokens: --processor DIR_OR_NAME "
                          "(or --model)")
    return str(source)


def _video_counter(fmt, processor, m: MeasureOptions):
    """The videos' counter where the processor has a video processor lengthscan counts (None where
    it has none and no video option asks for one)."""
    asked = m.videos or m.fps is not None or m.num_frames is not None or m.max_frames is not None
    if fmt is None or processor is None:
        if asked:
            raise ColumnError("--videos, --fps, --num-frames and --max-frames count the video tokens of a "
                              "conversation: give --messages COL and the model's processor (--processor DIR_OR_NAME)")
        return None
    from lengthscan.measure.video.counter import VideoConfigError, VideoCounter

    try:
        return VideoCounter(processor, fps=m.fps, num_frames=m.num_frames, max_frames=m.max_frames)
    except VideoConfigError as exc:
        if asked:
            raise ColumnError(str(exc)) from None
        return None


def _has_image_processor(source: str) -> bool:
    """The processor has an image processor: its preprocessor_config.json names one, or names no
    feature extractor (an audio model's names one and no image processor)."""
    from lengthscan.measure.model_files import config_files

    try:
        config = config_files(source, ("preprocessor_config.json",)).get("preprocessor_config.json", {})
    except ValueError:
        return True  # the image processor's own loading says what is wrong
    return "image_processor_type" in config or "feature_extractor_type" not in config


def _audio_counter(fmt, processor, audios_column):
    """The clips' counter where the processor counts audio (None where it does not and --audios is not given)."""
    if fmt is None or processor is None:
        if audios_column:
            raise ColumnError("--audios counts the audio tokens of a conversation: give --messages COL and the "
                              "model's processor (--processor DIR_OR_NAME)")
        return None
    from lengthscan.measure.audio.parts import AudioConfigError, AudioPartsCounter

    try:
        return AudioPartsCounter(processor)
    except AudioConfigError as exc:
        if audios_column:
            raise ColumnError(str(exc)) from None
        return None


def _chat_counter(counter, fmt, chat_template, train_on: str, processor=None, image_options: dict | None = None,
                  videos=None, audios=None, tokenizer_source=None):
    if fmt is None:
        return None
    from lengthscan.measure.chat.counter import ChatCounter, ChatOptions
    from lengthscan.measure.chat.metrics import TRAIN_ON

    if train_on not in TRAIN_ON:
        raise ColumnError(f"--train-on {train_on!r}: choose {', '.join(TRAIN_ON)}")
    images = None
    if processor is not None and fmt.vision:
        from lengthscan.measure.images.processor import ImageCounter

        images = ImageCounter(processor, counter.tokenizer, **(image_options or {}))
    for media in (videos, audios):
        if media is not None:
            media.bind(counter.tokenizer)
    if videos is not None:
        from lengthscan.measure.video.counter import VideoConfigError

        try:
            videos.check(counter.tokenizer)
        except VideoConfigError as exc:
            raise ColumnError(str(exc)) from None
    mistral = _mistral_file(tokenizer_source, processor, audios, chat_template, counter)
    if mistral is not None:
        from lengthscan.measure.chat.mistral import MistralChat

        if images is not None or videos is not None or fmt.reasoning:
            raise ColumnError("images, videos and --reasoning with a mistral-common tokenizer are not counted yet: "
                              "give the model's Hugging Face tokenizer and chat template, or leave them out")
        chat = MistralChat(counter, ChatOptions(fmt, None, train_on), mistral, audios=audios)
        chat.check()
        return chat
    chat = ChatCounter(counter, ChatOptions(fmt, str(chat_template) if chat_template else None, train_on),
                       images=images, videos=videos, audios=audios)
    chat.check()  # the template (and offsets where spans are needed) now, before any row is read
    return chat


def _mistral_file(source, processor, audios, chat_template, counter) -> str | None:
    """The mistral-common tokenizer file that encodes the conversations, where it does: Voxtral's
    (its processor encodes with mistral-common), or a tokenizer without a chat template that is
    mistral-common's own (tekken.json, tokenizer.model.vN) when no --chat-template is given."""
    voxtral = audios is not None and audios.family == "voxtral"
    if chat_template is not None:
        if voxtral:
            raise ColumnError("Voxtral's processor encodes conversations with mistral-common, not a Jinja template: "
                              "leave out --chat-template")
        return None
    if not voxtral and counter.facts().chat_template:
        return None
    from lengthscan.measure.chat.mistral import mistral_tokenizer_file

    for where in (source, processor):
        if isinstance(where, (str, Path)) and (found := mistral_tokenizer_file(where)):
            return found
    if voxtral:
        raise ColumnError("Voxtral's conversations are encoded by mistral-common: give the model's tekken.json "
                          "(--tokenizer DIR holding it)")
    return None


def _audio_settings(ctx, sampling_rate: int | None) -> AudioSettings:
    from lengthscan.measure.audio.durations import MAX_AUDIO_RATE, MIN_RATE, frame_rule

    fe_rate = getattr(ctx.feature_extractor, "sampling_rate", None) if ctx else None
    if fe_rate is not None and (isinstance(fe_rate, bool) or not isinstance(fe_rate, (int, float))
                                or not MIN_RATE <= fe_rate <= MAX_AUDIO_RATE or fe_rate != int(fe_rate)):
        from lengthscan.policy.model_limits import ModelError

        raise ModelError(f"model {ctx.name}: its feature extractor's sampling_rate {fe_rate!r} "
                         f"(preprocessor_config.json) is not a sample rate ({MIN_RATE:,} to {MAX_AUDIO_RATE:,} Hz); "
                         "fix the file")
    rule = frame_rule(feature_extractor=ctx.feature_extractor, config=ctx.config) if ctx else None
    rate = sampling_rate or (getattr(ctx.feature_extractor, "sampling_rate", None) if ctx else None) \
        or (rule.sampling_rate if rule else None)
    return AudioSettings(rate, rule)


@dataclass(frozen=True)
class Prepared:
    """The rules parsed, the gate, and the set-up: how audit and clean (on any engine) begin."""

    rules: tuple[Rule, ...]
    gate: tuple[str, float] | None  # parsed --fail-over: ('percent', 1.0) or ('rows', 250)
    setup: Setup

    @property
    def ratios(self) -> tuple[str, ...]:
        """Ratio metrics (``a/b``) whose distributions the rules need."""
        return tuple(dict.fromkeys(r.metric for r in self.rules if r.is_ratio))

    @property
    def absolute(self) -> bool:
        """Every threshold is known before any row is measured (numbers and model limits only)."""
        return all(r.kind in ("number", "model") for r in self.rules)


def prepare_run(measure: MeasureOptions, rules: RuleOptions) -> Prepared:
    """``--limit`` and ``--fail-over`` parsed, the set-up prepared, and every rule's metric checked
    to be measured."""
    from lengthscan.policy.decisions import check_rule_metrics, parse_fail_over, parse_rules

    parsed = parse_rules(rules.limits)
    gate_spec = parse_fail_over(rules.fail_over)
    setup = prepare(measure)
    check_rule_metrics(parsed, setup.fields)
    if rules.action == "drop-turns" or any(r.action == "drop-turns" for r in parsed):
        from lengthscan.policy.rules import RuleError

        if setup.chat is None or not setup.chat.options.format.messages:
            raise RuleError("drop-turns cuts conversations by their turns: it needs --messages COL (a "
                            "prompt-completion row has no turns to drop; use drop or truncate)")
    _check_crop_keeps_targets(measure, rules, parsed)
    unmeasured = getattr(setup.chat, "unmeasured", ())
    if any(part in unmeasured for r in parsed for part in r.parts):
        from lengthscan.policy.rules import RuleError

        raise RuleError(f"{', '.join(unmeasured)}: not measured for conversations mistral-common encodes; limit "
                        "another metric")
    actions = {rules.action, *(r.action for r in parsed if r.action)}
    dpo = setup.pairs is not None and setup.pairs.format.trainer == "dpo" and \
        getattr(setup.pairs.format, "truncation_mode", "keep_start") == "keep_start"
    if setup.pairs is not None and actions - ({"drop", "truncate"} if dpo else {"drop"}):
        from lengthscan.policy.rules import RuleError

        raise RuleError("preference pairs are dropped whole, or truncated as DPO pairs (--action truncate with "
                        "--tokenize: each pair's ids cut at the limit, a pair that would collapse dropped); "
                        "RewardTrainer filters long pairs, RL prompts are never cut, and a keep_end cut gives each "
                        "side its own prompt (no shared prompt_ids): use --action drop")
    chat = setup.chat
    media = [name for name, counter in (("images", chat and chat.images), ("videos", chat and chat.videos),
                                        ("audio", chat and chat.audios)) if counter is not None]
    if media and (rules.action != "drop" or any(r.action not in (None, "drop") for r in parsed)):
        from lengthscan.policy.rules import RuleError

        raise RuleError(f"conversations with {' and '.join(media)} are dropped whole over a limit: truncate and "
                        f"drop-turns would cut through them (use --action drop, or count them with a smaller budget: "
                        f"--max-pixels, --fps, --num-frames)")
    return Prepared(parsed, gate_spec, setup)


def _check_crop_keeps_targets(measure: MeasureOptions, rules: RuleOptions, parsed) -> None:
    """``--crop-audio`` with a ``--target``: a cropped clip would keep its whole transcript (mismatched
    pairs), so it is refused unless the target is a label (``--target-is-label``)."""
    from lengthscan.policy.rules import RuleError, effective_action

    crops = [r.text for r in parsed if effective_action(r, rules.action, rules.crop_audio) == "crop"]
    if crops and measure.audio and measure.target and not rules.target_is_label:
        raise RuleError(f"--crop-audio with --target {measure.target}: {crops[0]!r} would cut clips but keep "
                        f"their whole {measure.target} (a cropped clip would keep the text of the audio cut away), "
                        "so audio and text would no longer match. Drop the long clips instead (leave out "
                        "--crop-audio), or, if the target is a label (a class, a speaker) and not a transcript, "
                        "add --target-is-label")


def resolve_for(rules, src, tallies, setup: Setup, action: str, crop_audio: bool):
    """Resolve rules on the train split's distributions (all splits merged when there is none)."""
    from lengthscan.policy.rules import resolve_rules

    names = [s.name for s in src.splits]
    if "train" in names:
        basis = "train"
        hists = tallies[names.index("train")].histograms() if tallies is not None else {}
    else:
        basis = names[0] if len(names) == 1 else "all splits merged"
        hists = {}
        if tallies is not None:  # None: the rules are absolute, no distribution is needed
            from lengthscan.stats.histograms import merge_histograms

            per = [t.histograms() for t in tallies]
            hists = {k: (merge_histograms([p[k][0] for p in per]), per[0][k][1]) for k in per[0]}
    return resolve_rules(rules, histograms=hists, default_action=action, model_limits=setup.model_limits,
                         crop_audio=crop_audio, basis=basis), basis


def source_paths(source, src) -> list[str]:
    """The paths a source is read from: its files, and the path it was named by (a folder, a file)."""
    import os

    paths = [p for s in src.splits for p in s.layout().paths if p]
    if isinstance(source, (str, os.PathLike)) and os.path.exists(source):
        paths.append(os.fspath(source))
    return paths
