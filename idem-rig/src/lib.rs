//! # idem-rig: idem tools for rig agents
//!
//! Makes `#[tool]` functions (an idem [`ToolSet`](idem_core::ToolSet)) into rig tools bound to a
//! [`Run`](idem_core::Run), for rig-agent's `AgentBuilder::dynamic_tools`:
//!
//! ```
//! # use idem_core::{Idem, ToolSet};
//! # use idem_rig::RigToolSet;
//! # use rig_core::{DynModel, operation::Completion};
//! # fn demo(tool_set: ToolSet, model: DynModel<Completion>) -> rig_agent::Agent {
//! let idem = Idem::in_memory();
//! let tools = RigToolSet::new(tool_set, idem.run("conversation-42"));
//! rig_agent::AgentBuilder::new(model).dynamic_tools(tools.dynamic_tools()).build()
//! # }
//! ```
//!
//! Every call the agent makes goes through the idem protocol: the idempotency key comes from the
//! run, the tool's stable name and the arguments, so when the model calls `charge_card` again
//! after a timeout, the stored charge is replayed instead of charging twice. Everything the model
//! can cause (invalid arguments, a caller key reused with other arguments, an unknown outcome)
//! comes back as a failed rig tool result whose text the model reads, never a panic (see
//! [`tool_error`] for the mapping). How idem served each call (its run, key and outcome:
//! executed, replayed, joined, ...) is published in the call's result context as an
//! [`IdemReport`], for the host's hooks and logs; the model does not see it.
//!
//! Each call runs to its end in a task of its own: a host that stops waiting for the agent (a
//! timeout around the prompt, a web request whose client went away) does not cut an attempt off
//! halfway, and the call's outcome is stored for its repeat. A process that exits waits for
//! [`RigToolSet::calls_finished`] first.
//!
//! Built on rig-core 0.44's tool contracts ([`rig_core::tool::DynamicTool`]), without rig's
//! provider transports. A [`DynamicTool`](rig_core::tool::DynamicTool) is rig's form for tools
//! whose name is known at run time; rig's typed `Tool` trait needs a `const NAME`, which an
//! idem tool set cannot supply.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod result;
mod tools;

pub use result::{to_rig, tool_error};
/// The rig-core that idem-rig is built with: its `DynamicTool`s, `ToolOutput` and
/// `ToolContext` are this version's types, so an agent that takes them (and a `RunId` put in a
/// `ToolContext`) uses the same; another version's are other types, and rustc's "expected
/// `DynamicTool`, found `DynamicTool`" does not say why.
pub use rig_core;
pub use tools::{IdemReport, RigToolSet, RunId};
