"""kerngen.agent.llm."""
